"""TTS as a service for many users (docs/service.md): API keys as accounts (accounts.py) with limits
(limits.py), usage metering (usage.py), what one request cost (served.py), the exact audio cache
(cache/), batch jobs and their runner (batches/), and the one place the service asks the engine for
speech with a priority class (engine_requests.py, speech.py). ``Services`` (gateway/services.py) holds
them."""
