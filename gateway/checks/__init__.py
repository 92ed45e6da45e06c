"""`python -m gateway check` and the start-up model checks: what each check found and the fix
(model.py: the result type, the file checks, the start-up short form), the full run (run.py: load every
model the way the server does, speak a sentence and recognise it back) and its table/JSON (report.py).
docs/check.md."""
