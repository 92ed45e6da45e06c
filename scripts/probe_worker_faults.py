"""Engine worker faults under device traffic: what devices hear when the only worker stalls or dies.

    python scripts/probe_worker_faults.py                  # both probes, default settings
    python scripts/probe_worker_faults.py --probe stall    # SIGSTOP: time to the first apology
    python scripts/probe_worker_faults.py --probe kills --devices 20 --kills 5

Runs `python -m gateway serve` (fake TTS backend in one engine worker process, the `echo` LLM) in its
own process, with the gateway's default stall bound unless --stall-timeout is given.

- stall: one device asks for a long reply; once its audio flows the worker is frozen with SIGSTOP.
  Prints the time from SIGSTOP to the apology's `sentence_start` and to its first audio frame, then how
  long until /v1/health is `ok` again (the gateway kills a worker stuck 3 bounds and restarts it).
- kills: N devices ask one query after another (2-3 sentence replies); the worker is killed with
  SIGKILL K times, each time once it is back. Every turn is classed: `complete` (every sentence of the
  reply), `apology` (ends with the apology and its audio), `text only` (the apology's text, no audio),
  `silent` (a `tts start` and `tts stop` with neither audio nor a sentence: the device never hears
  why). The goal is 0 silent turns.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from gateway.xiaozhi import AudioOut, TtsSentenceStart  # noqa: E402
from scripts.device_sim import DeviceSimulator, Turn  # noqa: E402

APOLOGY = "Sorry, the speech engine had a problem."
QUERIES = [
    "The first sentence is here. The second one follows it. And a third to close.",
    "Tell me about the weather. It is sunny today.",
    "One more question for you. What time is it now?",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_gateway(port: int, stall_timeout: float | None, folder: Path) -> subprocess.Popen[bytes]:
    config = folder / "config.yaml"
    lines = [
        "tts: {backend: fake, text_normalization: 'off'}",
        "asr: {backend: none}",
        f"llm: {{provider: echo, apology: '{APOLOGY}'}}",
        "session: {enable_greeting: false}",
        "engine:",
        "  workers: 1",
        "  worker_backend_options: {ms_per_char: 60, chunk_ms: 200, compute_delay_s: 0.004}",
    ]
    if stall_timeout is not None:
        lines.append(f"  worker_stall_timeout_s: {stall_timeout}")
    config.write_text("\n".join(lines) + "\n", encoding="utf-8")
    env = {**os.environ, "XZ_SERVER__LOG_LEVEL": "warning"}
    return subprocess.Popen(
        [sys.executable, "-m", "gateway", "serve", "--config", str(config), "--host", "127.0.0.1",
         "--port", str(port)],
        cwd=ROOT, env=env,
    )  # fmt: skip


async def health(url: str) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=10) as client:
        return (await client.get(f"{url}/v1/health")).json()


async def wait_status(url: str, status: str, timeout: float) -> float:
    """Seconds until /v1/health says ``status`` (the probe polls; the server does not)."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        try:
            if (await health(url)).get("status") == status:
                return time.monotonic() - start
        except httpx.TransportError:
            pass
        await asyncio.sleep(0.1)
    raise TimeoutError(f"/v1/health not {status!r} within {timeout:.0f} s")


async def worker_pid(url: str) -> int:
    return int((await health(url))["engine"]["workers"][0]["pid"])


def classify(turn: Turn) -> str:
    frames = bool(turn.frames)
    if APOLOGY in turn.sentences:
        start = next(r.t for r in turn.records if getattr(r.event, "text", None) == APOLOGY)
        return "apology" if any(r.t >= start for r in turn.frames) else "text only"
    if not frames and not turn.sentences:
        return "silent"
    return "complete" if frames else "text only"


async def probe_stall(url: str) -> None:
    sim = DeviceSimulator(url, device_id="aa:bb:cc:00:09:01", protocol_version=1)
    await sim.connect()
    await sim.listen_start("auto")
    pid = await worker_pid(url)
    try:
        await sim.detect(" ".join(QUERIES))
        await sim.next_event(AudioOut, timeout=30)
        os.kill(pid, signal.SIGSTOP)
        stopped = time.monotonic()
        while (record := await sim.next_event(TtsSentenceStart, timeout=120)).event.text != APOLOGY:
            pass
        to_sentence = record.t - stopped
        to_audio = (await sim.next_event(AudioOut, timeout=30)).t - stopped
        state = (await health(url))["status"]
        await wait_status(url, "ok", timeout=180)
        back = time.monotonic() - stopped
    finally:
        await sim.close()
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
    print(
        f"SIGSTOP -> apology sentence_start: {to_sentence:.2f} s; -> its first audio frame: {to_audio:.2f} s"
    )
    print(f"/v1/health right after: {state}; `ok` again (killed and restarted) {back:.1f} s after SIGSTOP")


async def device_loop(url: str, index: int, stop: asyncio.Event, turns: list[Turn]) -> None:
    sim = DeviceSimulator(url, device_id=f"aa:bb:cc:00:0a:{index:02x}", protocol_version=1)
    await sim.connect()
    await sim.listen_start("auto")
    rng = random.Random(index)
    try:
        while not stop.is_set():
            turns.append(await sim.ask(rng.choice(QUERIES), timeout=120))
    finally:
        await sim.close()


async def probe_kills(url: str, devices: int, kills: int) -> None:
    stop = asyncio.Event()
    turns: list[Turn] = []
    tasks = [asyncio.create_task(device_loop(url, i, stop, turns)) for i in range(devices)]
    rng = random.Random(0)
    try:
        for _ in range(kills):
            await asyncio.sleep(rng.uniform(6.0, 12.0))  # turns of 3-5 s: some complete between kills
            os.kill(await worker_pid(url), signal.SIGKILL)
            await asyncio.sleep(0.5)
            await wait_status(url, "ok", timeout=120)
        await asyncio.sleep(3.0)
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
    counts: dict[str, int] = {}
    for turn in turns:
        kind = classify(turn)
        counts[kind] = counts.get(kind, 0) + 1
    print(f"{devices} devices, {kills} worker kills: {len(turns)} turns")
    for kind in ("complete", "apology", "text only", "silent"):
        print(f"  {kind:<10} {counts.get(kind, 0)}")


async def main_async(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        proc = start_gateway(port, args.stall_timeout, Path(tmp))
        try:
            await wait_status(url, "ok", timeout=120)
            commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                    text=True).stdout.strip()  # fmt: skip
            bound = args.stall_timeout if args.stall_timeout is not None else "default"
            print(f"commit {commit}; fake backend in 1 worker; stall bound: {bound}")
            if args.probe in ("stall", "both"):
                await probe_stall(url)
            if args.probe in ("kills", "both"):
                await probe_kills(url, args.devices, args.kills)
        finally:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--probe", choices=("stall", "kills", "both"), default="both")
    parser.add_argument("--devices", type=int, default=20)
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--stall-timeout", type=float, default=None, help="engine.worker_stall_timeout_s")
    return asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
