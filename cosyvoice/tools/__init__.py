"""Tooling around a CosyVoice3 model directory, not needed to run it: the file-by-file model check
(``model_check``, with the checkpoint keys and shapes in ``checkpoint_check`` and the wording of a finding in
``check_finding``) and the Hugging Face export of the speech LM (``export_hf``)."""
