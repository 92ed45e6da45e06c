"""Speech tokens -> 24 kHz waveform: each request's hops planned (``stream``), the flow and the vocoder run
for them, batched or in slices (``runner``), and the opt-in ``torch.compile`` of their two hot spots
(``compile``)."""

from cosyvoice.token2wav.runner import PendingCall, Token2Wav
from cosyvoice.token2wav.stream import HopJob, HopSchedule, SpeakerPrompt, Token2WavError, Token2WavStream

__all__ = ["HopJob", "HopSchedule", "PendingCall", "SpeakerPrompt", "Token2Wav", "Token2WavError", "Token2WavStream"]
