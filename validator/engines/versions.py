"""Which version entry of an engine profile a batch is judged by, and why.

A profile's ``versions`` (``rules/engines.json``) are the behaviours that differ; its optional
``releases`` list is every release read, in any order, each naming the version entry whose
behaviour it has and the values it sets on top of it (its kernel build, a switch's default). A new
release is a data addition: one more row.

Resolution never guesses silently. Every result carries ``judged_as``: the profile, the entry, the
release the batch is judged as (None: an entry without releases) and ``basis``, a sentence saying
why; ``warning`` is set when the release judged as is not the one asked for (a newer release than
any known). A release number that is neither known nor newer than every known release is an input
error naming the known ones.

Release numbers are ordered as PEP 440 orders them for the forms engines publish: ``0.5.12 <
0.5.12.post1 < 0.5.13``; pre-releases (``a``, ``b``, ``rc``) and ``.devN`` sort before the release.
"""
from __future__ import annotations

import re
from functools import lru_cache

from ..errors import InputError
from ..facts.knowledge import load

_RELEASE = re.compile(r"^v?(\d+(?:\.\d+)*)(?:(a|b|rc)(\d+))?(?:\.?post(\d+))?(?:\.?dev(\d+))?$", re.IGNORECASE)
_PRE = {"a": 0, "b": 1, "rc": 2}
# keys of a release row that describe it; every other key is set on the version entry it names
RELEASE_META = frozenset({"release", "version", "pins", "note", "source", "provenance"})


def release_key(text: str) -> tuple | None:
    """A sort key of a release number (None: not one). ``0.5.12`` and ``0.5.12.0`` are equal."""
    m = _RELEASE.match(str(text).strip())
    if m is None:
        return None
    nums = [int(p) for p in m.group(1).split(".")]
    while len(nums) > 1 and nums[-1] == 0:
        nums.pop()
    pre = (_PRE[m.group(2).lower()], int(m.group(3))) if m.group(2) else (3, 0)
    post = int(m.group(4)) if m.group(4) is not None else -1
    dev = int(m.group(5)) if m.group(5) is not None else 1 << 62
    if m.group(5) is not None and m.group(2) is None and m.group(4) is None:
        pre = (-1, 0)               # 1.0.dev1 sorts before 1.0a1
    return (tuple(nums), pre, post, dev)


def _in_range(key: tuple, entry: dict) -> bool:
    """Whether a release is in an entry's range; an entry without bounds has no range (it is chosen by name)."""
    lo, hi = entry.get("min_release"), entry.get("max_release")
    if lo is None and hi is None:
        return False
    return (lo is None or key >= release_key(lo)) and (hi is None or key <= release_key(hi))


def releases(profile: str) -> list[dict]:
    """The profile's release rows, oldest first."""
    rows = load("engines")["profiles"][profile].get("releases", [])
    return sorted(rows, key=lambda r: release_key(r["release"]))


def _entry(prof: dict, name: str) -> dict:
    return next(v for v in prof["versions"] if v["name"] == name)


def _newest_bound(prof: dict) -> tuple[str, tuple] | None:
    """The newest release a profile without a release list names in its ranges."""
    best = None
    for v in prof["versions"]:
        for k in ("min_release", "max_release"):
            if v.get(k):
                key = release_key(v[k])
                if best is None or key > best[1]:
                    best = (v[k], key)
    return best


def _judged(profile: str, entry: dict, release: dict | None, basis: str, warning: bool = False,
            asked: str | None = None) -> dict:
    out = {k: v for k, v in entry.items()}
    if release is not None:
        out.update({k: v for k, v in release.items() if k not in RELEASE_META and not k.startswith("_")})
        out["release"] = release["release"]
        out["matched_release"] = release["release"]     # the one release this stands for
        out["release_source"] = release.get("source")
        out["release_pins"] = list(release.get("pins", []))
    out["judged_as"] = {"profile": profile, "version": entry["name"],
                        "release": release["release"] if release is not None else out.get("matched_release"),
                        "asked": asked, "basis": basis, "warning": warning}
    return out


def _newest_in(profile: str, name: str) -> dict | None:
    rows = [r for r in releases(profile) if r["version"] == name]
    return rows[-1] if rows else None


def known_spellings(profile: str) -> list[str]:
    """Every version spelling a profile accepts: entry names, aliases and known releases."""
    prof = load("engines")["profiles"][profile]
    out = [v["name"] for v in prof["versions"]] + [a for v in prof["versions"] for a in v.get("aliases", [])]
    return out + [r["release"] for r in releases(profile)]


@lru_cache(maxsize=256)       # keyed by the version strings users give: bounded
def resolve_version(profile: str, version: str | None) -> dict:
    """The version entry a batch of ``profile`` is judged by (see the module docstring): by alias
    or name, by a known release, or by release ranges; with ``judged_as`` saying which and why."""
    prof = load("engines")["profiles"][profile]
    want = version if version is not None else prof["default_version"]
    want = str(want).strip()
    rows = releases(profile)
    given = f"version {want!r}" if version is not None else f"no version given (default {want!r})"
    for v in prof["versions"]:
        if want == v["name"] or want in v.get("aliases", []):
            newest = _newest_in(profile, v["name"])
            if newest is None:
                lo, hi = v.get("min_release"), v.get("max_release")
                if lo and lo == hi:         # an entry of one release is judged as that release
                    return _judged(profile, {**v, "matched_release": lo}, None,
                                   f"{given}: judged as {lo}, the one release of entry {v['name']!r}", asked=version)
                span = (f"releases {lo} .. {hi}" if lo and hi else f"releases from {lo}" if lo
                        else f"releases up to {hi}" if hi else "")
                what = f"entry {v['name']!r} ({span})" if span else f"entry {v['name']!r}, which names no release"
                return _judged(profile, v, None, f"{given}: judged with {what}", asked=version)
            span = [r["release"] for r in rows if r["version"] == v["name"]]
            what = "the newest known release" if newest is rows[-1] else "its newest release"
            return _judged(profile, v, newest, f"{given}: judged as {newest['release']}, {what} "
                                               f"(entry {v['name']!r}: {span[0]} .. {span[-1]})", asked=version)
    key = release_key(want)
    if key is None:
        raise InputError("engine", f"unknown version {want!r} of {profile}; known: "
                                   f"{', '.join(known_spellings(profile))} or a release number")
    for r in rows:
        if release_key(r["release"]) == key:
            return _judged(profile, _entry(prof, r["version"]), r, f"release {want} (given)", asked=version)
    if rows:
        newest, oldest = rows[-1], rows[0]
        if key > release_key(newest["release"]):
            return _judged(profile, _entry(prof, newest["version"]), newest,
                           f"{want} is newer than every known release: judged as {newest['release']}, the newest "
                           f"known", warning=True, asked=version)
        if key > release_key(oldest["release"]):
            raise InputError("engine", f"{profile} has no release {want}; known releases: "
                                       f"{', '.join(r['release'] for r in rows)} (newer ones are judged as the newest)")
        for v in prof["versions"]:
            if _in_range(key, v):
                return _judged(profile, {**v, "matched_release": want}, None,
                               f"{want} is older than the releases read ({oldest['release']} .. {newest['release']}): "
                               f"judged with entry {v['name']!r}, whose range includes it", asked=version)
    else:
        top = _newest_bound(prof)
        if top is not None and key > top[1]:
            v = next(v for v in prof["versions"] if _in_range(top[1], v))
            return _judged(profile, {**v, "matched_release": top[0]}, None,
                           f"{want} is newer than every known release: judged as {top[0]}, the newest known",
                           warning=True, asked=version)
        for v in prof["versions"]:
            if _in_range(key, v):
                return _judged(profile, {**v, "matched_release": want}, None,
                               f"release {want} (given): entry {v['name']!r}, by its release range", asked=version)
    ranges = [f"{v.get('min_release') or '...'} .. {v.get('max_release') or '...'}" for v in prof["versions"]
              if v.get("min_release") or v.get("max_release")]
    raise InputError("engine", f"unknown version {want!r} of {profile}: no entry's release range ({'; '.join(ranges) or 'none'}) "
                               f"includes it; known: {', '.join(known_spellings(profile))}")


def judged_label(v: dict) -> str:
    """How a resolved version reads in a report: the release judged as, else the entry's name."""
    return v["judged_as"]["release"] or v["name"]
