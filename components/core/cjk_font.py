"""Chinese that renders on a machine with no CJK font installed: the report's figures and its page use
Noto Sans CJK SC from the `manimgx-fonts-cjk` package (SIL Open Font License 1.1; a dependency).

The package ships the variable collection (`NotoSansCJK-VF.otf.ttc`: JP, KR, SC, TC, HK faces, whose
default weight is Thin). Two uses, each a regular-weight (400) instance of the SC face cut to the
characters needed, by fontTools (matplotlib's own dependency):

- figures: `ensure_matplotlib_fallback()` registers the 3,755 characters of GB 2312 level 1 and the
  common punctuation as a fallback after DejaVu Sans, so any Chinese label renders. Built once per
  machine (about 12 s, 0.8 MB) into the user's cache folder, written atomically.
- the HTML page: `page_font_face(text)` embeds the page's own Chinese characters as an @font-face
  (a few kB), so the report stays one self-contained file.

Without the package both return quietly (figures then show the missing-glyph box, the page falls back
to the system's CJK fonts); `available()` says which.
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import re
from functools import lru_cache
from pathlib import Path

FAMILY = "Report CJK"  # the family name of the instances built here
FACE = 2  # the SC face of the collection
WEIGHT = 400
PUNCTUATION = "，。、；：？！“”‘’（）《》【】—…·「」『』"
CJK = re.compile(r"[\u3000-\u303f\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff00-\uffef]")


def collection() -> Path | None:
    """The packaged Noto Sans CJK collection, or None when the package is not installed."""
    try:
        import manimgx_fonts_cjk
    except ImportError:
        return None
    path = Path(manimgx_fonts_cjk.__file__).parent / "NotoSansCJK-VF.otf.ttc"
    return path if path.exists() else None


def available() -> bool:
    return collection() is not None


def cjk_characters(text: str) -> str:
    """The distinct CJK characters of `text`, sorted."""
    return "".join(sorted(set(CJK.findall(text))))


def gb2312_level1() -> str:
    """The 3,755 most common simplified characters (GB 2312 level 1: rows 16–55)."""
    out = []
    for hi in range(0xB0, 0xD8):
        for lo in range(0xA1, 0xFF):
            try:
                out.append(bytes([hi, lo]).decode("gb2312"))
            except UnicodeDecodeError:
                pass
    return "".join(out)


def subset_font(characters: str) -> bytes:
    """A regular-weight OpenType font (CFF outlines) of the SC face, cut to `characters`, named FAMILY."""
    from fontTools import subset
    from fontTools.ttLib import TTCollection
    from fontTools.varLib import instancer

    path = collection()
    if path is None:
        raise RuntimeError("manimgx-fonts-cjk is not installed: no CJK font to cut")
    font = TTCollection(str(path)).fonts[FACE]
    opts = subset.Options()
    opts.layout_features = []
    opts.notdef_outline = True
    sub = subset.Subsetter(opts)
    sub.populate(text=characters)
    sub.subset(font)
    # CFF outlines, not CFF2: browsers' font sanitizers (Chromium's OTS) refuse a static CFF2 font
    static = instancer.instantiateVariableFont(font, {"wght": WEIGHT}, downgradeCFF2=True)
    name = static["name"]
    for rec in list(name.names):
        if rec.nameID in (1, 4, 16):
            name.setName(FAMILY, rec.nameID, rec.platformID, rec.platEncID, rec.langID)
        elif rec.nameID == 6:
            name.setName(FAMILY.replace(" ", ""), rec.nameID, rec.platformID, rec.platEncID, rec.langID)
    buf = io.BytesIO()
    static.save(buf)
    return buf.getvalue()


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "wordvec-to-transformer" / "fonts"


@lru_cache(maxsize=1)
def figure_font() -> Path | None:
    """The figures' CJK font file (built once per machine, then read from the cache), or None."""
    source = collection()
    if source is None:
        return None
    chars = gb2312_level1() + PUNCTUATION
    key = hashlib.sha256(f"{source.stat().st_size}:{FACE}:{WEIGHT}:cff:{chars}".encode()).hexdigest()[:16]
    path = cache_dir() / f"noto-sans-cjk-sc-{WEIGHT}-{key}.otf"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(subset_font(chars))
        os.replace(tmp, path)  # atomic: a concurrent build writes the same bytes
    return path


@lru_cache(maxsize=1)
def ensure_matplotlib_fallback() -> bool:
    """Register the figures' CJK font as matplotlib's last fallback (a glyph the default font lacks is
    drawn from it). False when the font package is not installed."""
    path = figure_font()
    if path is None:
        return False
    import matplotlib as mpl
    from matplotlib import font_manager

    font_manager.fontManager.addfont(str(path))
    # matplotlib falls back glyph by glyph along `font.family` (a generic family there stands for its
    # first installed font): the CJK font goes last.
    families = [f for f in mpl.rcParams["font.family"] if f != FAMILY]
    mpl.rcParams["font.family"] = [*families, FAMILY]
    return True


def has_cjk_text(fig) -> bool:  # a matplotlib Figure
    from matplotlib.text import Text

    return any(CJK.search(t.get_text() or "") for t in fig.findobj(Text))


def page_font_face(text: str) -> str:
    """An @font-face rule embedding the CJK characters of `text` (a data URI), or "" when there are
    none or the font package is not installed."""
    chars = cjk_characters(text)
    if not chars or collection() is None:
        return ""
    data = base64.b64encode(subset_font(chars + PUNCTUATION)).decode()
    return f'@font-face{{font-family:"{FAMILY}";src:url(data:font/otf;base64,{data}) format("opentype")}}'
