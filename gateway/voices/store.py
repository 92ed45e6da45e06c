"""Voice presets: YAML files in one folder, each naming a prompt recording and its transcript.

A preset ``voices/<name>.yaml`` holds::

    name: default            # [A-Za-z0-9_-]{1,64}, equal to the file stem
    prompt_wav: default.wav  # relative to the folder, or absolute; >= 16 kHz, 1..30 s, channels mixed to mono
    prompt_text: "..."       # transcript of prompt_wav (zero-shot cloning); empty: cross-lingual mode
    instruct: null           # optional instruct text (e.g. "用四川话说"); set: instruct mode by default
    description: ""          # optional
    fallback: espeak         # optional: prompt_wav missing -> speak prompt_text with espeak-ng instead

``VoiceStore`` validates every preset at ``load()`` (a bad one is skipped with a warning), adds uploaded
voices as one atomic unit and names the cache file a backend keeps prepared features in:
``.cache/<name>.<hash>.safetensors``, the hash covering the wav bytes and the transcript, so an edited
preset never reuses stale features.

An upload is written in two steps. ``stage()`` writes the recording as ``<name>.<sha256[:16]>.wav`` (a
new file: the recording of the current version is not touched); ``commit()`` then replaces
``<name>.yaml``, which names that exact file, with one ``os.replace``: the YAML is the commit record.
A crash before the commit leaves the old version whole (plus an unreferenced wav), a crash after it
the new one; ``discard()`` drops a staged upload that was refused. ``load()`` removes what a crash
leaves behind: temporary files and unreferenced ``<name>.<hash>.wav`` recordings older than
``STALE_AFTER_S`` (younger ones may belong to an upload in progress in another process).

Several gateways may share the folder (deploy/docker-compose.yml): ``refresh()``, called by the voice
API's handlers, picks up what another one added, replaced or removed (a stat of the folder when nothing
changed; only new or changed YAML files are read).

The store does file I/O only; it is used on the event loop at start-up and from upload handlers, and
hands the engine ``VoicePreset`` values (tts_engine/voices.py: what an engine, in this process or a
worker, needs of a voice). Nothing here knows about models.
"""

from __future__ import annotations

import hashlib
import logging
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from gateway.voices.files import MAX_TEXT_CHARS, atomic_write, read_preset, read_text, sync_dir
from tts_engine.errors import UnknownVoice
from tts_engine.voices import (
    VoiceError,
    VoicePreset,
    check_voice_name,
    decode_prompt_wav,
    preset_cache_path,
)

__all__ = ["StagedVoice", "VoiceExists", "VoiceStore"]

log = logging.getLogger(__name__)

CACHE_DIR = ".cache"
STALE_AFTER_S = 600.0  # leftovers of an interrupted write older than this are removed by load()
RACY_NS = 2_000_000_000  # refresh() trusts a file or folder timestamp once it is this old
_OWN_WAV_RE = re.compile(r"(?P<name>[A-Za-z0-9_-]{1,64})\.[0-9a-f]{16}\.wav")  # written by stage()
_TEMP_RE = re.compile(r"\..+\.tmp")  # written by atomic_write()


class VoiceExists(VoiceError):
    """``VoiceStore.add()`` without ``overwrite`` for a name that is taken."""


@dataclass(frozen=True, slots=True)
class StagedVoice:
    """An upload whose recording is on disk but that is not a voice yet: ``commit()`` or ``discard()`` it."""

    preset: VoicePreset
    wrote_wav: bool  # False: an identical recording was already there (discard leaves it)


def _is_stale(path: Path, now: float) -> bool:
    try:
        return now - path.stat().st_mtime > STALE_AFTER_S
    except OSError:
        return False


class VoiceStore:
    """The presets of one folder (``voices/``), plus uploads and the feature-cache names."""

    def __init__(self, directory: str | Path, *, espeak_executable: str = "espeak-ng") -> None:
        self.directory = Path(directory).resolve()
        self.cache_dir = self.directory / CACHE_DIR
        self.espeak_executable = espeak_executable
        self._presets: dict[str, VoicePreset] = {}
        self._files: dict[str, tuple[int, int] | None] = {}  # name -> (mtime_ns, size) of its YAML as read
        self._stamp: int | None = None  # the folder's mtime_ns when it was last read
        self._lock = threading.Lock()  # refresh() (API handlers' threads) against commit() and remove()
        self._loaded = False

    # -- reading -------------------------------------------------------------------------------

    def load(self, *, strict: bool = False) -> list[VoicePreset]:
        """(Re)read every ``*.yaml``; a bad one is logged and skipped, or raises VoiceError with ``strict``.

        Leftovers of interrupted writes (see the module docstring) are removed first.
        """
        if self.directory.is_dir():
            self._remove_leftovers()
        elif strict:
            raise VoiceError(f"{self.directory}: voice folder not found")
        self._scan(reuse=False, strict=strict)
        self._loaded = True
        return self.presets()

    def refresh(self) -> bool:
        """Pick up what another process sharing the folder (a second gateway) added, replaced or removed.

        One ``stat`` of the folder when nothing changed; else only new or changed YAML files are read
        (a bad one is skipped with a warning). True when the presets changed. Nothing before ``load()``.
        """
        with self._lock:
            if not self._loaded or self._folder_stamp() == self._stamp:
                return False
            before = self._presets
            self._scan(reuse=True, strict=False)
            return self._presets != before

    def _folder_stamp(self) -> int | None:
        try:
            return self.directory.stat().st_mtime_ns
        except OSError:
            return None

    def _scan(self, *, reuse: bool, strict: bool) -> None:
        """Read the folder's presets; ``reuse``: keep those whose YAML is unchanged since the last read."""
        stamp = self._folder_stamp()  # before the listing: a change during it shows at the next refresh
        presets: dict[str, VoicePreset] = {}
        files: dict[str, tuple[int, int] | None] = {}
        # Timestamps tick with the kernel's coarse clock (a few ms): a change made in the same tick as a
        # read would keep the stamp. So a stamp this recent is not trusted: the next refresh looks again.
        recent = time.time_ns() - RACY_NS
        for path in sorted(self.directory.glob("*.yaml")) if stamp is not None else []:
            try:
                stat = path.stat()
            except OSError:
                continue  # removed while listing
            key = (stat.st_mtime_ns, stat.st_size) if stat.st_mtime_ns < recent else None
            if reuse and key is not None and self._files.get(path.stem) == key and path.stem in self._presets:
                presets[path.stem], files[path.stem] = self._presets[path.stem], key
                continue
            try:
                preset = read_preset(path, self.directory, self.cache_dir, self.espeak_executable)
            except Exception as exc:  # any bad file: skipped, the server starts without it
                error = exc if isinstance(exc, VoiceError) else VoiceError(f"{path}: {exc!r}")
                if strict:
                    raise error from exc
                log.warning("skipping voice preset: %s", error)
                continue
            presets[preset.name], files[preset.name] = preset, key
        self._presets, self._files = presets, files
        self._stamp = stamp if stamp is not None and stamp < recent else None

    def _remove_leftovers(self) -> None:
        """Delete stale temporary files and stale recordings of uploads that were never committed."""
        now = time.time()
        folders = [self.directory] + ([self.cache_dir] if self.cache_dir.is_dir() else [])
        for folder in folders:
            for path in folder.iterdir():
                if _TEMP_RE.fullmatch(path.name) and path.is_file() and _is_stale(path, now):
                    self._remove_leftover(path, "temporary file of an interrupted write")
        referenced = self._referenced_files()
        if referenced is None:
            return
        named = set(referenced.values())
        for path in self.directory.glob("*.wav"):
            if path.name in named or not _is_stale(path, now):
                continue
            # An upload never committed, or the recording of a version replaced just before a crash
            # (``<name>.wav``, as earlier versions wrote it, while ``<name>.yaml`` names a newer one).
            match = _OWN_WAV_RE.fullmatch(path.name)
            newer = referenced.get(path.stem, "")
            replaced = (m := _OWN_WAV_RE.fullmatch(newer)) is not None and m["name"] == path.stem
            if match is not None or replaced:
                self._remove_leftover(path, "recording that no voice uses (an interrupted upload)")

    def _referenced_files(self) -> dict[str, str] | None:
        """Preset name -> the file name its ``prompt_wav`` names (None: a YAML is unreadable, keep all)."""
        names: dict[str, str] = {}
        for path in self.directory.glob("*.yaml"):
            try:
                data = yaml.safe_load(read_text(path))
            except Exception:
                return None
            if isinstance(data, dict) and isinstance(data.get("prompt_wav"), str):
                names[path.stem] = Path(data["prompt_wav"]).name
        return names

    @staticmethod
    def _remove_leftover(path: Path, what: str) -> None:
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            log.warning("cannot remove %s %s: %s", what, path, exc)
            return
        log.warning("removed %s: %s", what, path)

    def presets(self) -> list[VoicePreset]:
        return [self._presets[name] for name in sorted(self._presets)]

    def names(self) -> list[str]:
        return sorted(self._presets)

    def get(self, name: str) -> VoicePreset:
        preset = self._presets.get(name)
        if preset is None:
            raise UnknownVoice(name, self.names())
        return preset

    def __contains__(self, name: object) -> bool:
        return name in self._presets

    # -- writing -------------------------------------------------------------------------------

    def add(
        self,
        name: str,
        wav_bytes: bytes,
        prompt_text: str,
        *,
        instruct: str | None = None,
        description: str = "",
        overwrite: bool = False,
    ) -> VoicePreset:
        """Check an uploaded recording and save it as a voice: ``stage()`` then ``commit()``."""
        staged = self.stage(
            name, wav_bytes, prompt_text, instruct=instruct, description=description, overwrite=overwrite
        )
        try:
            return self.commit(staged)
        except BaseException:
            self.discard(staged)
            raise

    def stage(
        self,
        name: str,
        wav_bytes: bytes,
        prompt_text: str,
        *,
        instruct: str | None = None,
        description: str = "",
        overwrite: bool = False,
    ) -> StagedVoice:
        """Check an upload and write its recording as ``<name>.<hash>.wav``; the voice set is unchanged.

        The returned preset can be prepared by an engine before ``commit()`` makes it the voice.
        """
        check_voice_name(name)
        for key, value in (
            ("prompt_text", prompt_text),
            ("instruct", instruct),
            ("description", description),
        ):
            if value is not None and not isinstance(value, str):
                raise VoiceError(f"voice {name!r}: {key} must be a string")
            if value is not None and len(value) > MAX_TEXT_CHARS:
                raise VoiceError(f"voice {name!r}: {key} is longer than {MAX_TEXT_CHARS} characters")
        if name in self._presets and not overwrite:
            raise VoiceExists(f"voice {name!r} already exists")
        yaml_path = self.directory / f"{name}.yaml"
        if yaml_path.exists() and not overwrite:
            raise VoiceExists(f"voice {name!r} already exists ({yaml_path})")
        data = bytes(wav_bytes)
        decode_prompt_wav(data, source=f"voice {name!r}: uploaded wav")
        self.directory.mkdir(parents=True, exist_ok=True)
        wav_path = self.directory / f"{name}.{hashlib.sha256(data).hexdigest()[:16]}.wav"
        wrote = not (wav_path.is_file() and wav_path.read_bytes() == data)
        if wrote:
            atomic_write(wav_path, data)
        preset = VoicePreset(
            name, wav_path, prompt_text.strip(), (instruct or "").strip() or None, description.strip()
        )
        return StagedVoice(preset, wrote)

    def commit(self, staged: StagedVoice) -> VoicePreset:
        """Make a staged upload the voice: one atomic replace of ``<name>.yaml``, then the old recording goes."""
        preset = staged.preset
        assert preset.prompt_wav is not None
        fields = {
            "name": preset.name,
            "prompt_wav": preset.prompt_wav.name,
            "prompt_text": preset.prompt_text,
            "instruct": preset.instruct,
            "description": preset.description,
        }
        yaml_path = self.directory / f"{preset.name}.yaml"
        with self._lock:
            atomic_write(yaml_path, yaml.safe_dump(fields, allow_unicode=True, sort_keys=False).encode("utf-8"))
            previous = self._presets.get(preset.name)
            self._presets[preset.name] = preset
        if previous is not None and previous.prompt_wav != preset.prompt_wav:
            self._remove_own_wav(previous)
        return preset

    def discard(self, staged: StagedVoice) -> None:
        """Drop a staged upload that was not committed (its recording, unless a voice uses that file)."""
        path = staged.preset.prompt_wav
        if (
            staged.wrote_wav
            and path is not None
            and all(p.prompt_wav != path for p in self._presets.values())
        ):
            path.unlink(missing_ok=True)

    def remove(self, name: str) -> None:
        """Delete the preset's YAML (the commit point), its own recording and its cached features."""
        with self._lock:
            preset = self.get(name)
            (self.directory / f"{name}.yaml").unlink(missing_ok=True)
            sync_dir(self.directory)
            self._presets.pop(name, None)
        self._remove_own_wav(preset)
        if self.cache_dir.is_dir():
            for cached in self.cache_dir.glob(f"{name}.*"):
                if cached.name.split(".", 1)[0] == name:
                    cached.unlink(missing_ok=True)

    def _remove_own_wav(self, preset: VoicePreset) -> None:
        """Delete the recording a former version of a voice used, if the store wrote it and nothing uses it."""
        wav = preset.prompt_wav
        if wav is None or wav.parent != self.directory:
            return
        own = wav.name == f"{preset.name}.wav" or (
            (match := _OWN_WAV_RE.fullmatch(wav.name)) is not None and match["name"] == preset.name
        )
        if own and all(p.prompt_wav != wav for p in self._presets.values()):
            try:
                wav.unlink(missing_ok=True)
            except OSError as exc:  # the voice change is done; load() removes the file later
                log.warning("cannot remove the former recording %s: %s", wav, exc)

    # -- cache ---------------------------------------------------------------------------------

    def cache_path(self, name: str, *, key: str = "") -> Path:
        """Where prepared features of ``name`` live: ``.cache/<name>.<hash>.safetensors`` (see ``preset_cache_path``)."""
        return preset_cache_path(self.get(name), self.cache_dir, key=key)
