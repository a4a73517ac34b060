"""A small stack of local wheels for resumequal bisect's tests, built in-process (no
network, no build backend): a data source in two versions, the newer of which stops saving
part of its cursor, among harmless packages that change version too.

``rqb-cursor`` provides the workload ``rqb_cursor.workload:build``: ``dropout-mlp`` read
through :class:`CursorSource`. Version 1.0 saves the whole cursor; 2.0 leaves its position
out ("derived on load", a plausible refactoring) and resumes at the start of the epoch, so
a resumed run reads other samples than the control leg: FAIL at the first step after the
resume, boundary ``inputs``. The others are ``rqb-alpha`` .. ``rqb-golf``, 1.0 and 2.0, a
module with a version each; ``rqb-alpha`` 2.0 needs ``rqb-golf>=2`` (a mix with alpha 2.0
and golf 1.0 is one the resolver refuses). ``rqb-hotel`` and ``rqb-india`` flip the
verdict only together: hotel 2.0 offers "lazy cursors", india 2.0 turns them on, and the
data source (even 1.0) then leaves its position out; ``rqb-juliet`` changes beside them.
"""

from __future__ import annotations

import base64
import hashlib
import zipfile
from collections.abc import Mapping, Sequence
from importlib import metadata
from pathlib import Path

from resumequal.bisect.pins import canonical

CURSOR = "rqb-cursor"
HARMLESS = tuple(f"rqb-{n}" for n in ("alpha", "bravo", "charlie", "delta", "echo",
                                      "foxtrot", "golf"))
NEEDS = {("rqb-alpha", "2.0"): ("rqb-golf>=2.0",)}
PAIR = ("rqb-hotel", "rqb-india")
BESIDE_PAIR = "rqb-juliet"
# What each 2.0 of the pair adds to its module.
PAIR_FLAGS = {"rqb-hotel": "LAZY_CURSORS = True\n", "rqb-india": "USE_LAZY_CURSORS = True\n"}

WORKLOAD = '''\
"""dropout-mlp read through a data source whose cursor version {version} saves."""
import dataclasses

from resumequal.workloads import dropout_mlp

SAVES_POSITION = {saves}


def saves_position():
    """1.0 saves it, unless lazy cursors are both offered (rqb-hotel 2.0) and turned on
    (rqb-india 2.0)."""
    try:
        import rqb_hotel
        import rqb_india
    except ImportError:
        return SAVES_POSITION
    lazy = getattr(rqb_hotel, "LAZY_CURSORS", False) and getattr(rqb_india, "USE_LAZY_CURSORS",
                                                                  False)
    return SAVES_POSITION and not lazy


class CursorSource:
    def __init__(self, stream):
        self.stream = stream

    def next_microbatch(self):
        return self.stream.next_microbatch()

    def synthetic_microbatch(self):
        return self.stream.synthetic_microbatch()

    def state_dict(self):
        cursor = self.stream.state_dict()
        if not saves_position():
            del cursor["position"]  # 2.0: "derived on load" -- it is not
        return cursor

    def load_state_dict(self, state):
        self.stream.load_state_dict({{"position": 0, **state}})


def build(ctx):
    base = dropout_mlp.build(ctx)
    return dataclasses.replace(base, dataset=CursorSource(base.dataset),
                               description={{**base.description, "name": "rqb-cursor"}})
'''


def wheel(folder: Path, name: str, version: str, files: Mapping[str, str],
          requires: Sequence[str] = ()) -> Path:
    """A pure-Python wheel of ``files`` with its metadata and RECORD."""
    dist = f"{name.replace('-', '_')}-{version}"
    entries = dict(files)
    entries[f"{dist}.dist-info/METADATA"] = (
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
        + "".join(f"Requires-Dist: {r}\n" for r in requires))
    entries[f"{dist}.dist-info/WHEEL"] = ("Wheel-Version: 1.0\nGenerator: resumequal-tests\n"
                                          "Root-Is-Purelib: true\nTag: py3-none-any\n")
    record = []
    for path, text in entries.items():
        digest = hashlib.sha256(text.encode()).digest()
        encoded = base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
        record.append(f"{path},sha256={encoded},{len(text.encode())}\n")
    entries[f"{dist}.dist-info/RECORD"] = "".join(record) + f"{dist}.dist-info/RECORD,,\n"
    out = folder / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(out, "w") as archive:
        for path, text in entries.items():
            archive.writestr(path, text)
    return out


def build_wheels(folder: Path) -> Path:
    """Both versions of every package of the stack into ``folder`` (a find-links dir)."""
    folder.mkdir(parents=True, exist_ok=True)
    for version, saves in (("1.0", True), ("2.0", False)):
        wheel(folder, CURSOR, version, {
            "rqb_cursor/__init__.py": f'__version__ = "{version}"\n',
            "rqb_cursor/workload.py": WORKLOAD.format(version=version, saves=saves)})
        for name in (*HARMLESS, *PAIR, BESIDE_PAIR):
            module = name.replace("-", "_")
            flag = PAIR_FLAGS.get(name, "") if version == "2.0" else ""
            wheel(folder, name, version,
                  {f"{module}/__init__.py": f'__version__ = "{version}"\n{flag}'},
                  NEEDS.get((name, version), ()))
    return folder


def base_pins(site: Path) -> list[str]:
    """``name==version`` of every distribution in ``site`` but resumequal: what both pins
    hold alike (the environment the tests run in: torch and all)."""
    found = {canonical(d.metadata["Name"]): f"{d.metadata['Name']}=={d.version}"
             for d in metadata.distributions(path=[str(site)]) if d.metadata["Name"]}
    return [line for name, line in sorted(found.items()) if name != "resumequal"]


def pin_file(path: Path, base: Sequence[str], versions: Mapping[str, str]) -> Path:
    """A pip-freeze style pin file: ``base`` and ``versions`` (package -> version)."""
    lines = [*base, *(f"{n}=={v}" for n, v in sorted(versions.items()))]
    path.write_text("".join(f"{line}\n" for line in sorted(lines, key=str.lower)))
    return path
