"""What each class is, for the farmer who reads the model's answer: its cause, what to look for to confirm it by eye,
how it spreads, what is done about it.

Three layers, each key over the one below: the notes the project ships (``class_notes.toml`` beside this module), a
farm's own file (``[web] class_notes``: its language, its extension service's advice, a class its expert added), and
the notes written on the page (``<state>/class-notes.toml``, :mod:`edge_agent.farm_notes`). A file that cannot be read,
is not TOML, or holds a key or value of the wrong kind is a :class:`NotesError` naming the file, the class and the key:
at start (the page never shows half a file); once started, :class:`NotesSource` keeps the notes it had and logs why.
"""

from __future__ import annotations

import threading
import unicodedata
from dataclasses import dataclass, fields
from importlib import resources
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10 (JetPack 6)
    import tomli as tomllib

from edge_agent.log import get_logger
from edge_agent.names import class_name_problem, describe_class, is_disease
from engines.durable import read_at_most
from engines.errors import EdgeAgentError

__all__ = [
    "ClassNote",
    "ClassNotes",
    "NotesError",
    "NotesSource",
    "load_notes",
    "note_values",
    "notes_or_shipped",
    "shipped_notes_path",
    "MAX_NOTES_BYTES",
    "MAX_TEXT",
    "PAGE_NOTES",
    "TEXT_KEYS",
]

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
    def told(self) -> bool:
        """The note says how to check or what to do (one that only names the class, as a farm's may, does not)."""
        return bool(self.look_for or self.act or self.urgency)

    @property
    def title(self) -> str:
        """The class as the farmer reads it: the farm's name, else the disease's part of the model's name."""
        title = self.name or describe_class(self.label)[1]
        return title[:1].upper() + title[1:]


#: The keys of a note that hold text.
TEXT_KEYS = tuple(f.name for f in fields(ClassNote) if f.name not in ("label", "looks_like"))
_KEYS = (*TEXT_KEYS, "looks_like")
#: The file in the state directory that the page writes a farm's notes to (over the shipped ones and ``[web] class_notes``).
PAGE_NOTES = "class-notes.toml"


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

    def title(self, label: str, beside: str = "") -> str:
        """``label`` as the farmer reads it: its note's name, else the condition's part of the model's name; named
        beside the class ``beside`` of another crop, its crop added ("Bacterial spot (Tomato)" on a pepper's page)."""
        title = (self._notes.get(label) or ClassNote(label)).title
        crop = describe_class(label)[0]
        return f"{title} ({crop})" if beside and crop != describe_class(beside)[0] else title

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


def load_notes(extra: str | Path | None = None, page: Path | None = None) -> ClassNotes:
    """The shipped notes, with the file ``extra`` (a farm's own; empty or None: none) over them key by key, and the
    page's file ``page`` (where it exists) over both."""
    shipped = shipped_notes_path()
    notes, sources = _read(shipped, {}, "the shipped notes are part of the package: reinstall it"), [shipped]
    if extra:
        path = Path(extra).expanduser()
        notes = _read(path, notes, 'fix it, or set [web] class_notes to "" for the shipped notes only')
        sources.append(path)
    if page is not None and page.exists():
        notes = _read(page, notes, "fix it, or delete it (the notes written on the page)")
        sources.append(page)
    return ClassNotes(notes, tuple(sources))


class NotesSource:
    """The notes in force, read again when one of their files changes (an editor saves the farm's file, the page writes
    its own): the daemon and the page see a change without a restart. The first read raises :class:`NotesError`;
    later, a file that cannot be used keeps the notes read before, and the log says why once."""

    def __init__(self, extra: str | Path | None = None, page: Path | None = None) -> None:
        self.extra, self.page = (Path(extra).expanduser() if extra else None), page
        self._stamp: tuple | None = None
        self._notes: ClassNotes | None = None
        self._lock = threading.Lock()
        self.problem = ""  # why a file changed since cannot be used (the notes read before in force), or """

    def current(self) -> ClassNotes:
        """The notes as their files are now."""
        stamp = tuple(_stamp(p) for p in (self.extra, self.page))
        with self._lock:
            if stamp != self._stamp:
                try:
                    self._notes = load_notes(self.extra, self.page)
                    self.problem = ""
                except NotesError as exc:
                    if self._notes is None:
                        raise
                    self.problem = str(exc)
                    get_logger("notes").warning("class_notes_unusable", error=str(exc), using="the notes read before")
                self._stamp = stamp
            return self._notes

    def get(self, label: str) -> ClassNote | None:
        return self.current().get(label)

    def title(self, label: str, beside: str = "") -> str:
        return self.current().title(label, beside)


def notes_or_shipped(extra: str | Path | None, page: Path | None, log) -> NotesSource:
    """A :class:`NotesSource` of these files, or where they cannot be used at start, of the shipped notes alone and one
    warning in ``log``: the daemon's alerts go out whatever a notes file holds (the page refuses to start on it)."""
    source = NotesSource(extra, page)
    try:
        source.current()
    except NotesError as exc:
        log.warning("class_notes_unusable", error=str(exc), using="the shipped notes")
        source = NotesSource()
    return source


def _stamp(path: Path | None) -> tuple:
    """What tells one version of a file from the next (a file replaced by a rename is another inode)."""
    if path is None:
        return ()
    try:
        st = path.stat()
    except OSError:
        return ("absent",)
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def _read(path: Path, under: dict[str, ClassNote], fix: str) -> dict[str, ClassNote]:
    """The notes of ``path`` laid over ``under`` (a key the file gives replaces that key; the others stay)."""
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
        values = note_values(path, label, entry)
        before = out.get(label, ClassNote(label))
        out[label] = ClassNote(**{**before.__dict__, **values})
    return out


def note_values(path: Path | str, label: str, entry: object) -> dict[str, object]:
    """One class's entry of a notes file, checked: its texts stripped, its look-alikes a tuple; :class:`NotesError`
    naming ``path``, the class and the key where it is not a class's note."""
    problem = class_name_problem(label)
    if problem:
        raise NotesError(f"{path}: [{label[:60]!r}] is not a class name ({problem})")
    if not isinstance(entry, dict):
        raise NotesError(f'{path}: {label} must be a table (["{label}"] followed by its keys), not a value')
    unknown = sorted(set(entry) - set(_KEYS))
    if unknown:
        raise NotesError(f'{path}: ["{label}"] {unknown[0]}: not a key of a class note (keys: {", ".join(_KEYS)})')
    values: dict[str, object] = {}
    for key in TEXT_KEYS:
        if key in entry:
            text = entry[key]
            if not isinstance(text, str) or len(text) > MAX_TEXT:
                raise NotesError(f'{path}: ["{label}"] {key}: must be text of at most {MAX_TEXT} characters')
            if any(unicodedata.category(ch)[0] == "C" and ch not in "\n\t" for ch in text):
                raise NotesError(f'{path}: ["{label}"] {key}: holds control or invisible characters')
            values[key] = text.strip()
    if "looks_like" in entry:
        others = entry["looks_like"]
        if not isinstance(others, list) or not all(isinstance(o, str) and not class_name_problem(o) for o in others):
            raise NotesError(f'{path}: ["{label}"] looks_like: must be a list of class names, such as ["Tomato___Early_blight"]')
        values["looks_like"] = tuple(others[:20])
    if values.get("source") and not str(values["source"]).startswith(("https://", "http://")):
        raise NotesError(f'{path}: ["{label}"] source: must be a web address (https://...)')
    return values
