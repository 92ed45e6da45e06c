"""Audio containers and codecs: Opus packets, WAV files. Imports nothing of ours."""

from audio_codecs.errors import AudioCodecError, OpusDecodeError, WavFormatError
from audio_codecs.opus import OpusDecoder, OpusEncoder, packet_duration_ms
from audio_codecs.wav import float_to_int16, read_wav, streaming_wav_header, wav_bytes

__all__ = [
    "AudioCodecError",
    "OpusDecodeError",
    "OpusDecoder",
    "OpusEncoder",
    "WavFormatError",
    "float_to_int16",
    "packet_duration_ms",
    "read_wav",
    "streaming_wav_header",
    "wav_bytes",
]
