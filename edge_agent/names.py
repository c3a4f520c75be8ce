"""The names that travel between machines and reach pages and terminals: one rule each, checked wherever one is given.

A device's name (its certificate's file name, ``[handoff] name``, a hello, a sample's ``device``, the Fleet page) and
a class name (an expert's label on the page, the API, the command line, and the trainer taking it) are refused with a
sentence saying why; nothing downstream has to escape or truncate them.
"""

from __future__ import annotations

import re
import unicodedata

__all__ = [
    "pretty_class",
    "DEVICE_NAME",
    "device_name_problem",
    "class_name_problem",
    "CLASS_NAME_MAX",
    "class_phrase",
    "describe_class",
    "is_disease",
    "ordinal",
    "printable",
]

#: Letters, digits, ``.``, ``_`` and ``-``, at most 64, starting with a letter or digit; matched whole (``fullmatch``:
#: no trailing newline slips through a ``$``).
DEVICE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
#: The longest class name taken.
CLASS_NAME_MAX = 100


def device_name_problem(name: str) -> str | None:
    """Why ``name`` cannot name a device, or None."""
    if DEVICE_NAME.fullmatch(name):
        return None
    shown = name.encode("ascii", "backslashreplace").decode()[:80]
    return f"{shown!r} is not a device name (letters, digits, '.', '_' and '-', at most 64, starting with a letter or digit)"


def class_name_problem(label: str) -> str | None:
    """Why ``label`` cannot be a class name (control or invisible characters, a path separator, spaces around it,
    over 100 characters), or None."""
    if len(label) > CLASS_NAME_MAX:
        return f"longer than {CLASS_NAME_MAX} characters"
    if label != label.strip() or not label:
        return "empty, or spaces around it"
    if "/" in label or "\\" in label:
        return "holds a path separator"
    if any(unicodedata.category(ch)[0] == "C" for ch in label):
        return "holds control or invisible characters"
    return None


def printable(text: str) -> str:
    """``text`` safe to print on a terminal: control and invisible characters (escape sequences that set a window's
    title, clear the screen or colour it) shown as ``\\x1b``-style escapes, everything else as it is."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in text)


def describe_class(label: str) -> tuple[str, str]:
    """(plant, condition) of a class name such as ``Tomato___Late_blight`` -> ("Tomato", "Late blight")."""
    plant, _, condition = label.partition("___")
    clean = lambda s: " ".join(s.replace("_", " ").replace(",", ", ").split())  # noqa: E731
    return clean(plant), clean(condition) or clean(plant)


def pretty_class(label: str) -> str:
    """``Tomato___Early_blight`` as people read it: ``Tomato · Early blight``."""
    plant, condition = describe_class(label)
    return condition if condition == plant else f"{plant} · {condition}"


def class_phrase(label: str) -> str:
    """A class as a sentence names it: ``Tomato___Late_blight`` -> "Late blight (Tomato)" (a one-part name as it is)."""
    plant, condition = describe_class(label)
    return condition if condition == plant else f"{condition} ({plant})"


def ordinal(n: int) -> str:
    """``n`` as an ordinal: 1st, 2nd, 3rd, 4th, 11th, 22nd."""
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def is_disease(label: str) -> bool:
    """True for a class that names a disease: every class whose name does not end in ``healthy``."""
    return not label.lower().rstrip("_ ").endswith("healthy")
