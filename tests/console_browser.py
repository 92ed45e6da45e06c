"""Headless Chromium for the web console's tests: Debian's ``chromium`` driven by Playwright.

Playwright's own browser download is never used (``executable_path``); the microphone is Chromium's
fake capture device fed from a WAV file. Screenshots go to ``test-artifacts/`` (git-ignored).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"


def require_browser() -> None:
    """Skip (with the reason) where Chromium or Playwright is not installed: scripts/setup.sh installs both.

    In CI (``CI`` set) a missing browser is a failure, never a silent skip.
    """
    problem = None
    try:
        import playwright.async_api  # noqa: F401
    except ImportError:
        problem = "pip install playwright (the test extra)"
    if problem is None and not Path(CHROMIUM).exists():
        problem = "no chromium: apt-get install chromium (scripts/setup.sh)"
    if problem is not None:
        if os.environ.get("CI"):
            pytest.fail(f"browser tests cannot run in CI: {problem}")
        pytest.skip(problem)


@contextlib.asynccontextmanager
async def chromium_page(mic_wav: Path | None = None) -> AsyncIterator:
    from playwright.async_api import async_playwright

    args = [
        "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--autoplay-policy=no-user-gesture-required",
        "--use-fake-device-for-media-stream", "--use-fake-ui-for-media-stream",
    ]  # fmt: skip
    if mic_wav is not None:
        args.append(f"--use-file-for-fake-audio-capture={mic_wav}")
    with tempfile.TemporaryDirectory(prefix="xz-chromium-") as profile:
        async with async_playwright() as pw:
            context = await pw.chromium.launch_persistent_context(
                profile, executable_path=CHROMIUM, headless=True, args=args,
                viewport={"width": 1400, "height": 820}, ignore_default_args=["--mute-audio"],
            )  # fmt: skip
            try:
                page = context.pages[0] if context.pages else await context.new_page()
                errors: list[str] = []
                page.on("pageerror", lambda exc: errors.append(str(exc)))
                page.errors = errors  # type: ignore[attr-defined]
                yield page
            finally:
                await context.close()


async def screenshot(page, name: str) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / name
    await page.screenshot(path=str(path), full_page=True)
    return path
