"""Reading a label store's rows straight from SQLite, as the label and synth tests check them."""

from __future__ import annotations

import sqlite3
from pathlib import Path


def store_rows(path: Path) -> list[sqlite3.Row]:
    conn = sqlite3.connect(path)
    conn.row_factory = sqlite3.Row
    try:
        return list(conn.execute("SELECT * FROM labels"))
    finally:
        conn.close()
