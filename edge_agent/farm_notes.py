"""A farm's notes on a class written on the page (a class's page, the Diseases page): kept in
``<state>/class-notes.toml`` over the shipped notes and ``[web] class_notes`` (:mod:`edge_agent.class_notes`), one
class's entry replaced at a time, the file written whole to a new name and renamed into place, so a reader sees the
old notes or the new, never half of them."""

from __future__ import annotations

import json
import threading
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10 (JetPack 6)
    import tomli as tomllib

from edge_agent.class_notes import MAX_NOTES_BYTES, TEXT_KEYS, NotesError, note_values
from engines.durable import atomic_write, read_at_most

__all__ = ["save_note", "page_note"]

_HEADER = (
    "# This farm's notes on the classes, written on the edge-agent page (a class's page: \"This farm's notes\").\n"
    "# Each key replaces the shipped note's and [web] class_notes'; a key left empty on the page is not here.\n"
    "# It is TOML: it may be edited by hand while the page runs (the page reads it again when it changes).\n"
)
_lock = threading.Lock()  # one writer at a time in this process (the page's threads)


def page_note(path: Path, label: str) -> dict[str, str]:
    """The texts this file gives ``label`` (none where the file or its entry is not there)."""
    return {k: v for k, v in _table(path).get(label, {}).items() if k in TEXT_KEYS and isinstance(v, str)}


def save_note(path: Path, label: str, texts: dict[str, str]) -> dict[str, str]:
    """``label``'s entry in the page's notes file replaced by ``texts`` (its text keys; an empty one is left out, so the
    note below shows there; an entry with none is removed); the entry kept. Raises :class:`NotesError` naming the key
    where a text is not one a note takes (too long, control characters, a source that is no web address), and where the
    file as it stands cannot be read, before anything is written; and where it cannot be written (a full disk), with
    the file as it was."""
    entry = {k: texts[k].replace("\r\n", "\n").strip() for k in TEXT_KEYS if (texts.get(k) or "").strip()}
    note_values("the page", label, entry)  # the checks every notes file's entries pass
    with _lock:
        table = _table(path)
        if entry:
            table[label] = entry
        else:
            table.pop(label, None)
        text = _HEADER + "".join(_entry(name, values) for name, values in table.items())
        if len(text.encode()) > MAX_NOTES_BYTES:
            raise NotesError(f"{path}: the notes would grow past {MAX_NOTES_BYTES} bytes: shorten some")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(path, text.encode("utf-8"))
        except OSError as exc:  # a full disk, a read-only card: the notes before stay as they were
            raise NotesError(f"{path}: cannot be written ({exc.strerror or exc}): nothing was changed") from None
    return entry


def _table(path: Path) -> dict[str, dict]:
    """The file's classes and their keys as TOML reads them ({} where there is no file); :class:`NotesError` where it
    cannot be read (a hand edit gone wrong: fixed by hand first, never overwritten)."""
    if not path.exists():
        return {}
    try:
        data = read_at_most(path, MAX_NOTES_BYTES)
        if data is None:
            raise NotesError(f"{path}: larger than {MAX_NOTES_BYTES} bytes: shorten it by hand")
        table = tomllib.loads(data.decode("utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise NotesError(f"{path}: cannot be read to add to it ({exc}): fix or delete it by hand") from None
    for label, entry in table.items():
        note_values(path, label, entry)
    return table


def _entry(label: str, values: dict) -> str:
    """One class's table in TOML: JSON's strings and lists of strings are TOML's basic strings and arrays."""
    lines = "".join(f"{key} = {json.dumps(value, ensure_ascii=False)}\n" for key, value in values.items())
    return f"\n[{json.dumps(label, ensure_ascii=False)}]\n{lines}"
