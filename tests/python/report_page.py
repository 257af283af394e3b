"""Opening a report page in headless Chromium (Debian's `chromium`): its DOM as the
browser built it, and a screenshot to look at."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def dump_dom(page: Path, profile: Path) -> str:
    """The page's DOM after Chromium loaded it (scripts and SVG parsed)."""
    out = subprocess.run([CHROMIUM, *_FLAGS, f"--user-data-dir={profile}", "--dump-dom", page.resolve().as_uri()],
                         capture_output=True, text=True, timeout=120, check=True)
    return out.stdout


def screenshot(page: Path, profile: Path, png: Path, size: str = "1200,1600") -> Path:
    subprocess.run([CHROMIUM, *_FLAGS, f"--user-data-dir={profile}", f"--screenshot={png}", f"--window-size={size}",
                    page.resolve().as_uri()], capture_output=True, timeout=120, check=True)
    return png
