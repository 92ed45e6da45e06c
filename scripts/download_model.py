"""Download the speech models: Fun-CosyVoice3-0.5B-2512 (TTS) and SenseVoiceSmall (ASR).

    python scripts/download_model.py [--only tts|asr] [--source auto|modelscope|hf] [--verify]
                                     [--tts-dest DIR] [--asr-dest DIR] [--include GLOB ...] [--all] [--rl]
                                     [--no-prompt] [--modelscope-endpoint URL] [--hf-endpoint URL]

``--source auto`` (the default) takes each model from ModelScope and falls back to Hugging Face when
ModelScope cannot list it or a file fails. Every file is resumed after an interruption (run the command
again; complete files are skipped by size) and checked against the size and checksum the hub announces
before it is renamed into place; ``--verify`` also re-hashes files already there. The file the loaders
look for (``cosyvoice3.yaml``, SenseVoice's ``config.yaml``) is fetched last, so a directory that has it
is complete.

- Fun-CosyVoice3-0.5B-2512 (about 4.4 GB) into ``models/Fun-CosyVoice3-0.5B``: what our loader reads,
  not the TensorRT-only estimator ONNX, the batched tokenizer ONNX, BlankEN's unused
  ``model.safetensors``, ``llm.rl.pt`` (``--rl`` adds it) or the hub's assets (``--all`` takes every
  file, ``--include`` only the files matching a glob). ``tts.model_dir`` points there by default.
- SenseVoiceSmall (ModelScope ``iic/SenseVoiceSmall``, Hugging Face ``FunAudioLLM/SenseVoiceSmall``,
  about 0.9 GB) into ``models/SenseVoiceSmall``: what FunASR's AutoModel reads from a local directory
  (``configuration.json`` and the files it names). ``asr.model: auto`` uses that directory when present.
- Silero VAD ships in the ``silero-vad`` package (a dependency): nothing to download.
- The default voice's prompt recording (CosyVoice's ``asset/zero_shot_prompt.wav``) into
  ``voices/default.wav``, with the TTS model, unless ``--no-prompt``. Without it the gateway speaks the
  preset's transcript with espeak-ng and clones that (robotic, with a warning).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run as a file: make `scripts.` and `gateway.` importable
    sys.path.insert(0, str(REPO_ROOT))

from scripts.hub_download import (  # noqa: E402
    DEFAULT_ENDPOINTS,
    HUBS,
    DownloadError,
    LocalError,
    ProgressFactory,
    RemoteFile,
    check_free_space,
    download_file,
    human,
    list_repo,
    say,
    select_files,
    tqdm_progress,
)

PROMPT_URL = "https://raw.githubusercontent.com/FunAudioLLM/CosyVoice/main/asset/zero_shot_prompt.wav"
PROMPT_DEST = REPO_ROOT / "voices" / "default.wav"


def configuration_references(dest: Path) -> set[str]:
    """Files that FunASR's ``configuration.json`` names (``file_path_metas``), relative to the model."""
    path = dest / "configuration.json"
    try:
        metas = json.loads(path.read_text(encoding="utf-8")).get("file_path_metas", {})
    except (OSError, ValueError, AttributeError) as exc:
        raise DownloadError(f"{path} is not readable JSON: {exc}") from exc
    found: set[str] = set()

    def walk(value: object) -> None:
        if isinstance(value, dict):
            for item in value.values():
                walk(item)
        elif isinstance(value, str) and value:
            found.add(value)

    walk(metas)
    return found


@dataclass(frozen=True)
class ModelSet:
    key: str  # what --only names
    title: str
    repos: Mapping[str, str]  # hub -> repository id
    dest: Path
    approx_size: str
    exclude: tuple[str, ...] = ()  # default selection: all but these ...
    include: tuple[str, ...] = ()  # ... or only these
    required: tuple[str, ...] = ()  # a default selection without one of these means the release changed
    last: str | None = None  # fetched last: the loaders use the directory once it is there
    references: Callable[[Path], set[str]] | None = field(default=None, compare=False)


COSYVOICE_REPO = "FunAudioLLM/Fun-CosyVoice3-0.5B-2512"
TTS = ModelSet(
    key="tts",
    title="Fun-CosyVoice3-0.5B-2512",
    repos={"modelscope": COSYVOICE_REPO, "hf": COSYVOICE_REPO},
    dest=REPO_ROOT / "models" / "Fun-CosyVoice3-0.5B",
    approx_size="4.4 GB",
    exclude=(
        "flow.decoder.estimator.fp32.onnx",  # TensorRT path only
        "speech_tokenizer_v3.batch.onnx",  # not used by the frontend
        "CosyVoice-BlankEN/model.safetensors",  # never read: llm.pt holds every LLM weight
        "llm.rl.pt",  # --rl
        "asset/*",
        ".gitattributes",
    ),
    required=(
        "cosyvoice3.yaml",
        "llm.pt",
        "flow.pt",
        "hift.pt",
        "campplus.onnx",
        "speech_tokenizer_v3.onnx",
        "CosyVoice-BlankEN/config.json",
        "CosyVoice-BlankEN/tokenizer_config.json",
        "CosyVoice-BlankEN/vocab.json",
        "CosyVoice-BlankEN/merges.txt",
    ),
    last="cosyvoice3.yaml",
)
ASR = ModelSet(
    key="asr",
    title="SenseVoiceSmall",
    repos={"modelscope": "iic/SenseVoiceSmall", "hf": "FunAudioLLM/SenseVoiceSmall"},
    dest=REPO_ROOT / "models" / "SenseVoiceSmall",
    approx_size="0.9 GB",
    include=(
        "configuration.json",  # names the weights, tokenizer and CMVN files (any other is fetched too)
        "config.yaml",
        "model.pt",
        "am.mvn",
        "chn_jpn_yue_eng_ko_spectok.bpe.model",
        "tokens.json",
    ),
    required=(
        "configuration.json",
        "config.yaml",
        "model.pt",
        "am.mvn",
        "chn_jpn_yue_eng_ko_spectok.bpe.model",
    ),
    last="config.yaml",
    references=configuration_references,
)
MODEL_SETS = {m.key: m for m in (TTS, ASR)}


@dataclass
class Fetched:
    model: ModelSet
    dest: Path
    hub: str
    paths: list[Path]

    @property
    def size(self) -> int:
        return sum(p.stat().st_size for p in self.paths)


def fetch_model(
    client: httpx.Client,
    model: ModelSet,
    dest: Path | None = None,
    *,
    source: str = "auto",
    endpoints: Mapping[str, str] | None = None,
    include: Sequence[str] = (),
    exclude: Sequence[str] | None = None,
    verify: bool = False,
    progress: ProgressFactory = tqdm_progress,
) -> Fetched:
    """One model set from ``source`` (``auto``: ModelScope, then Hugging Face)."""
    dest = dest or model.dest
    hubs = list(HUBS) if source == "auto" else [source]
    errors = []
    for hub in hubs:
        try:
            endpoint = (endpoints or {}).get(hub) or DEFAULT_ENDPOINTS[hub]
            paths = _fetch_from(client, model, hub, endpoint, dest, include, exclude, verify, progress)
            return Fetched(model, dest, hub, paths)
        except LocalError:
            raise
        except DownloadError as exc:
            errors.append(f"{HUBS[hub]}: {exc}")
            if hub != hubs[-1]:
                say(f"{model.title} from {HUBS[hub]}: {exc}; trying {HUBS[hubs[hubs.index(hub) + 1]]}")
    raise DownloadError(f"{model.title}: " + "; ".join(errors))


def _fetch_from(
    client: httpx.Client,
    model: ModelSet,
    hub: str,
    endpoint: str,
    dest: Path,
    include: Sequence[str],
    exclude: Sequence[str] | None,
    verify: bool,
    progress: ProgressFactory,
) -> list[Path]:
    repo = model.repos[hub]
    listing = list_repo(client, hub, repo, endpoint=endpoint)
    by_path = {f.path: f for f in listing}
    default = not include  # the model's own selection (perhaps widened by --all / --rl)
    if include:
        files = select_files(listing, include=include, last=model.last)
    elif model.include and exclude is None:
        files = select_files(listing, include=model.include, last=model.last)
    else:
        files = select_files(listing, exclude=model.exclude if exclude is None else exclude, last=model.last)
    if not files:
        raise DownloadError(f"no file of {repo} matches the selection")
    if default and (missing := [p for p in model.required if p not in by_path]):
        raise DownloadError(
            f"{repo} has no {', '.join(missing)}: the release changed; please report it "
            "(or take its files with --include/--all)"
        )
    check_free_space(files, dest)
    say(f"{model.title}: {len(files)} files from {HUBS[hub]} ({repo}) into {dest}")
    body = [f for f in files if f.path != model.last]
    tail = [f for f in files if f.path == model.last]
    paths = [download_file(client, f, dest, progress=progress, verify=verify) for f in body]
    if default and model.references is not None:
        chosen = {f.path for f in files}
        for name in sorted(model.references(dest) - chosen):
            if name not in by_path:
                raise DownloadError(f"configuration.json of {repo} names {name}, which the hub does not list")
            paths.append(download_file(client, by_path[name], dest, progress=progress, verify=verify))
    paths += [download_file(client, f, dest, progress=progress, verify=verify) for f in tail]
    return paths


def fetch_prompt(
    client: httpx.Client, url: str = PROMPT_URL, target: Path = PROMPT_DEST, **options: Any
) -> Path:
    """The default voice's prompt recording (kept when present)."""
    if target.is_file() and target.stat().st_size > 0:
        return target
    return download_file(client, RemoteFile(target.name, url), target.parent, **options)


def silero_vad_model() -> str:
    """Where the Silero VAD model is, or what to do about it (it ships in the silero-vad package)."""
    try:
        from gateway.asr.vad import VADUnavailable, find_silero_model
    except ImportError as exc:
        return f"not checked ({exc}); run scripts/setup.sh"
    try:
        return f"shipped in the silero-vad package ({find_silero_model()})"
    except VADUnavailable as exc:
        return f"MISSING: {exc}"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=sorted(MODEL_SETS), help="one model set (default: both)")
    parser.add_argument("--source", choices=("auto", *HUBS), default="auto")
    for hub, name in HUBS.items():
        parser.add_argument(
            f"--{hub}-endpoint", default=DEFAULT_ENDPOINTS[hub], help=f"{name} base URL (a mirror)"
        )
    parser.add_argument("--tts-dest", type=Path, default=TTS.dest)
    parser.add_argument("--asr-dest", type=Path, default=ASR.dest)
    parser.add_argument("--include", action="append", default=[], metavar="GLOB", help="only these files")
    parser.add_argument("--all", action="store_true", help="every file of the repository")
    parser.add_argument("--rl", action="store_true", help="also llm.rl.pt (the RL-tuned LLM, 2 GB)")
    parser.add_argument("--verify", action="store_true", help="re-hash files that look complete")
    parser.add_argument("--no-prompt", action="store_true", help=f"do not fetch {PROMPT_DEST}")
    parser.add_argument("--prompt-url", default=PROMPT_URL)
    parser.add_argument("--prompt-dest", type=Path, default=PROMPT_DEST)
    return parser


def main(argv: list[str] | None = None, *, transport: httpx.BaseTransport | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if (args.include or args.all) and not args.only:
        parser.error("--include and --all need --only tts or --only asr")
    models = [MODEL_SETS[args.only]] if args.only else [TTS, ASR]
    exclude: tuple[str, ...] | None = None
    if args.all:
        exclude = ()
    elif args.rl:
        exclude = tuple(p for p in TTS.exclude if p != "llm.rl.pt")
    endpoints = {"modelscope": args.modelscope_endpoint, "hf": args.hf_endpoint}
    dests = {"tts": args.tts_dest, "asr": args.asr_dest}
    timeout = httpx.Timeout(30.0, read=120.0)
    headers = {"User-Agent": "xiaozhi-gateway"}
    done: list[Fetched] = []
    failed = False
    prompt = None
    try:
        with httpx.Client(
            follow_redirects=True, timeout=timeout, headers=headers, transport=transport
        ) as client:
            for model in models:
                try:
                    done.append(
                        fetch_model(
                            client,
                            model,
                            dests[model.key],
                            source=args.source,
                            endpoints=endpoints,
                            include=args.include,
                            exclude=exclude if model is TTS or args.all else None,
                            verify=args.verify,
                        )
                    )
                except DownloadError as exc:
                    say(f"error: {exc}")
                    failed = True
                    if isinstance(exc, LocalError):
                        break
            if TTS in models and not args.no_prompt:
                try:
                    prompt = fetch_prompt(client, args.prompt_url, args.prompt_dest)
                except DownloadError as exc:
                    say(f"warning: no default voice prompt ({exc}); espeak-ng stands in for it")
    except KeyboardInterrupt:
        say("interrupted: run the same command again to resume")
        return 130
    for item in done:
        print(
            f"{item.model.title}: {len(item.paths)} files, {human(item.size)} in {item.dest} ({HUBS[item.hub]})"
        )
    if ASR in models:
        print(f"Silero VAD: {silero_vad_model()}")
    if prompt is not None:
        print(f"default voice prompt: {prompt}")
    if failed:
        say(
            "some downloads failed (see above); run the same command again to resume "
            "(--source picks one hub; --modelscope-endpoint / --hf-endpoint a mirror)"
        )
        return 1
    print("next: python -m gateway check")
    return 0


if __name__ == "__main__":
    sys.exit(main())
