"""What each class is, for the farmer who reads the model's answer: its cause, what to look for to confirm it by eye,
how it spreads, what is done about it.

The project ships notes on every disease of the shipped model (``class_notes.toml`` beside this module); a farm's own
file (``[web] class_notes``: its language, its extension service's advice, a class its expert added) replaces them
key by key. A farm's file that cannot be read, is not TOML, or holds a key or value of the wrong kind is a
:class:`NotesError` naming the file, the class and the key, at start: the page never shows half a file.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from importlib import resources
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10 (JetPack 6)
    import tomli as tomllib

from edge_agent.names import class_name_problem, describe_class, is_disease
from engines.durable import read_at_most
from engines.errors import EdgeAgentError

__all__ = ["ClassNote", "ClassNotes", "NotesError", "load_notes", "notes_or_shipped", "shipped_notes_path", "MAX_NOTES_BYTES", "MAX_TEXT"]

#: The largest notes file read (the shipped one, 26 diseases, is about 20 KB).
MAX_NOTES_BYTES = 1 << 20
#: The longest text one key may hold.
MAX_TEXT = 2000


class NotesError(EdgeAgentError, ValueError):
    """A class-notes file cannot be used; the message names the file, the class and the key, and the fix."""


@dataclass(frozen=True)
class ClassNote:
    """What one class is; every text may be empty (a farm's file may give only some)."""

    label: str
    name: str = ""  # the class as the farmer calls it; empty: the model's name, as people read it
    cause: str = ""
    look_for: str = ""
    spread: str = ""
    act: str = ""
    urgency: str = ""  # why it cannot wait, where it cannot
    looks_like: tuple[str, ...] = ()  # class names it is often confused with
    source: str = ""  # where to read more (a URL)

    @property
    def hint(self) -> str:
        """The first clause of what to look for ("Long, narrow, rectangular tan to grey spots ..."): one line that tells
        this class from the others where a labeller chooses between them."""
        return self.look_for.split(";")[0].split(". ")[0].rstrip(".").strip()

    @property
    def title(self) -> str:
        """The class as the farmer reads it: the farm's name, else the disease's part of the model's name."""
        title = self.name or describe_class(self.label)[1]
        return title[:1].upper() + title[1:]


_TEXT_KEYS = tuple(f.name for f in fields(ClassNote) if f.name not in ("label", "looks_like"))
_KEYS = (*_TEXT_KEYS, "looks_like")


def shipped_notes_path() -> Path:
    """The notes shipped with the package."""
    return Path(str(resources.files("edge_agent") / "class_notes.toml"))


class ClassNotes:
    """The notes in force: the shipped ones with a farm's file over them."""

    def __init__(self, notes: dict[str, ClassNote], sources: tuple[Path, ...]):
        self._notes = notes
        self.sources = sources  # the files read, the shipped one first

    def get(self, label: str) -> ClassNote | None:
        """The note on ``label``, or None (a healthy class, a class no file describes)."""
        return self._notes.get(label)

    def title(self, label: str) -> str:
        """``label`` as the farmer reads it: its note's name, else the condition's part of the model's name."""
        return (self._notes.get(label) or ClassNote(label)).title

    def labels(self) -> list[str]:
        """Every class a note describes, in the files' order."""
        return list(self._notes)

    def unknown_to(self, classes: list[str]) -> list[str]:
        """The classes notes describe that are not among ``classes`` (a misspelt key, or a class still to come)."""
        known = set(classes)
        return [label for label in self._notes if label not in known]

    def missing(self, classes: list[str]) -> list[str]:
        """The diseases among ``classes`` that no note describes (a class the expert added)."""
        return [c for c in classes if is_disease(c) and c not in self._notes]


def load_notes(extra: str | Path | None = None) -> ClassNotes:
    """The shipped notes, with the file ``extra`` (a farm's own; empty or None: none) over them key by key."""
    shipped = shipped_notes_path()
    notes = _read(shipped, {})
    if not extra:
        return ClassNotes(notes, (shipped,))
    path = Path(extra).expanduser()
    return ClassNotes(_read(path, notes), (shipped, path))


def notes_or_shipped(extra: str | Path | None, log) -> ClassNotes:
    """:func:`load_notes`, or where the farm's file cannot be used, the shipped notes and one warning in ``log``: the
    daemon's alerts go out whatever a notes file holds (the page refuses to start on it, and says why)."""
    try:
        return load_notes(extra)
    except NotesError as exc:
        log.warning("class_notes_unusable", error=str(exc), using="the shipped notes")
        return load_notes()


def _read(path: Path, under: dict[str, ClassNote]) -> dict[str, ClassNote]:
    """The notes of ``path`` laid over ``under`` (a key the file gives replaces that key; the others stay)."""
    fix = 'fix it, or set [web] class_notes to "" for the shipped notes only'
    try:
        data = read_at_most(path, MAX_NOTES_BYTES)
    except OSError as exc:
        raise NotesError(f"{path}: cannot read the class notes ({exc.strerror or exc}): {fix}") from None
    if data is None:
        raise NotesError(f"{path}: larger than {MAX_NOTES_BYTES} bytes, not a class-notes file: {fix}")
    try:
        table = tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise NotesError(f"{path}: not UTF-8 text (byte {exc.start}): save it as UTF-8") from None
    except tomllib.TOMLDecodeError as exc:
        raise NotesError(f"{path}: not TOML ({exc}): {fix}") from None
    out = dict(under)
    for label, entry in table.items():
        problem = class_name_problem(label)
        if problem:
            raise NotesError(f"{path}: [{label[:60]!r}] is not a class name ({problem})")
        if not isinstance(entry, dict):
            raise NotesError(f'{path}: {label} must be a table (["{label}"] followed by its keys), not a value')
        unknown = sorted(set(entry) - set(_KEYS))
        if unknown:
            raise NotesError(f'{path}: ["{label}"] {unknown[0]}: not a key of a class note (keys: {", ".join(_KEYS)})')
        values: dict[str, object] = {}
        for key in _TEXT_KEYS:
            if key in entry:
                text = entry[key]
                if not isinstance(text, str) or len(text) > MAX_TEXT:
                    raise NotesError(f'{path}: ["{label}"] {key}: must be text of at most {MAX_TEXT} characters')
                values[key] = text.strip()
        if "looks_like" in entry:
            others = entry["looks_like"]
            if not isinstance(others, list) or not all(isinstance(o, str) and not class_name_problem(o) for o in others):
                raise NotesError(f'{path}: ["{label}"] looks_like: must be a list of class names, such as ["Tomato___Early_blight"]')
            values["looks_like"] = tuple(others[:20])
        if "source" in values and values["source"] and not values["source"].startswith(("https://", "http://")):
            raise NotesError(f'{path}: ["{label}"] source: must be a web address (https://...)')
        before = out.get(label, ClassNote(label))
        out[label] = ClassNote(**{**before.__dict__, **values})
    return out
