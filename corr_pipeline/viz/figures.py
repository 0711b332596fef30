"""Figures as PNG bytes: matplotlib figures on the Agg canvas (no pyplot, no display,
thread-safe per figure), reduced to a 256-colour palette with Pillow and kept under
``max_bytes`` (default :data:`DEFAULT_MAX_PNG_BYTES`) by lowering the resolution if needed;
symbol names are drawn verbatim (no mathtext).

``png_data_uri`` / ``png_markdown`` embed PNG bytes in markdown as
``![alt](data:image/png;base64,...)``, the form the Dagster UI shows (its markdown sanitizer
allows ``data:`` image sources); the Dagster metadata itself is built in
:mod:`corr_pipeline.defs.pictures`.
"""

import base64
import contextlib
import io
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np

DEFAULT_MAX_PNG_BYTES = 200_000
"""Upper bound on each picture's PNG size (it travels base64-encoded in run metadata)."""

_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def png_data_uri(png: bytes) -> str:
    """``data:image/png;base64,...`` for PNG bytes (checks the PNG signature)."""
    if not isinstance(png, bytes | bytearray) or not bytes(png[:8]) == _PNG_MAGIC:
        raise ValueError("not PNG bytes (missing the PNG signature)")
    return "data:image/png;base64," + base64.b64encode(bytes(png)).decode("ascii")


def png_markdown(png: bytes, alt: str = "image") -> str:
    """Markdown image ``![alt](data:image/png;base64,...)`` (alt text sanitised)."""
    safe_alt = " ".join(str(alt).replace("[", "(").replace("]", ")").split())
    return f"![{safe_alt}]({png_data_uri(png)})"


# --------------------------------------------------------------------------------------------
# rendering
# --------------------------------------------------------------------------------------------


def new_figure(width_in: float, height_in: float, dpi: int = 100) -> tuple[Any, Any]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width_in, height_in), dpi=dpi)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    return fig, ax


def set_title(ax: Any, head: str, sub: str) -> None:
    """Title of ``ax`` at its left: ``head``, broken into lines that fit between the axes' left
    edge and the figure's right edge (:func:`fit_lines`), then ``sub`` on a line of its own."""
    title = ax.set_title(head, fontsize=10, loc="left")
    title.set_parse_math(False)
    fig = ax.figure
    renderer = fig.canvas.get_renderer()
    room = fig.bbox.width - ax.get_window_extent(renderer).x0 - 4.0
    font = title.get_fontproperties()

    def fits(line: str) -> bool:
        width, _, _ = renderer.get_text_width_height_descent(line, font, ismath=False)
        return bool(width <= room)

    title.set_text("\n".join([*fit_lines(head, fits), *([sub] if sub else [])]))


def fit_lines(text: str, fits: Callable[[str], bool]) -> list[str]:
    """``text`` as lines that each satisfy ``fits``: the whole when it fits; else broken before
    the last `` (`` whose first part fits (a parenthesised note goes whole to the next line);
    else between words, as many on a line as fit (a single word too long stays one line)."""
    if fits(text):
        return [text]
    for at in reversed([i for i in range(1, len(text)) if text.startswith(" (", i)]):
        if fits(text[:at]):
            return [text[:at], *fit_lines(text[at + 1 :], fits)]
    words = text.split(" ")
    lines = [words[0]]
    for word in words[1:]:
        joined = f"{lines[-1]} {word}"
        if fits(joined):
            lines[-1] = joined
        else:
            lines.append(word)
    return lines


def safe_tick_labels(labels: Iterable[Any]) -> None:
    for label in labels:
        label.set_parse_math(False)


@contextlib.contextmanager
def quiet_drawing() -> Iterator[None]:
    """Drawing or measuring text without the warnings that are no errors: fonts without a glyph
    for some symbol characters (drawn as boxes), ``tight_layout`` giving up."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*[Gg]lyph.*missing.*")
        warnings.filterwarnings("ignore", message=r".*tight_layout.*")
        yield


def figure_png(
    fig: Any, *, max_bytes: int = DEFAULT_MAX_PNG_BYTES, paint: Any = None, tight: bool = True
) -> bytes:
    """Render ``fig`` to a palette PNG no larger than ``max_bytes`` (lowering dpi if needed),
    after ``tight_layout`` unless ``tight`` is false (a figure laid out by hand).

    ``paint(fig, image)`` may draw into the rendered RGB ``PIL.Image`` before it is encoded
    (called at each resolution tried).
    """
    from PIL import Image

    dpi = float(fig.dpi)
    png = b""
    try:
        for _ in range(6):
            fig.set_dpi(dpi)
            with quiet_drawing():
                if tight:
                    fig.tight_layout()
                fig.canvas.draw()
            rgba = np.asarray(fig.canvas.buffer_rgba())
            image = Image.fromarray(np.ascontiguousarray(rgba[..., :3]), "RGB")
            if paint is not None:
                paint(fig, image)
            image = image.quantize(
                colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE
            )
            buf = io.BytesIO()
            image.save(buf, format="PNG", optimize=True)
            png = buf.getvalue()
            if len(png) <= max_bytes:
                return png
            dpi *= 0.8
        raise ValueError(
            f"picture still {len(png):,} bytes at {dpi / 0.8:.0f} dpi, over max_bytes={max_bytes:,}"
        )
    finally:
        fig.clear()
