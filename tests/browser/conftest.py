"""``import chromium`` (tests/chromium.py), in any import mode."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
