"""Speech tokens -> 24 kHz waveform: the flow and the vocoder driven hop by hop (``stream``), and the opt-in
``torch.compile`` of their two hot spots (``compile``)."""

from cosyvoice.token2wav.stream import (
    HopJob,
    HopSchedule,
    PendingCall,
    SpeakerPrompt,
    Token2Wav,
    Token2WavError,
    Token2WavStream,
)

__all__ = ["HopJob", "HopSchedule", "PendingCall", "SpeakerPrompt", "Token2Wav", "Token2WavError", "Token2WavStream"]
