"""The toy world's scenes: its vocabulary (shapes, colours, backgrounds, sizes, grid positions,
attributes), the Obj / Scene / Mention records, seeded scene generation (`make_scene`,
`make_scenes`) and drawing (`render`, `contact_sheet`). Split from mocojax/data/toyworld.py (the
world's captions, parser and metrics), which re-exports these names."""

import dataclasses

import numpy as np
from PIL import Image, ImageDraw

SHAPES = ("circle", "square", "triangle", "diamond", "star")
COLOURS = {
    "red": (215, 40, 40),
    "green": (40, 160, 60),
    "blue": (45, 85, 215),
    "yellow": (235, 200, 30),
    "purple": (135, 60, 175),
    "orange": (245, 130, 30),
}
BACKGROUNDS = {"white": (248, 248, 248), "gray": (150, 150, 150), "black": (22, 22, 22)}
SIZES = ("small", "large")
# Grid cells in row-major order; the canonical name is what rubric items say.
POSITIONS = (
    "top left",
    "top",
    "top right",
    "left",
    "center",
    "right",
    "bottom left",
    "bottom",
    "bottom right",
)
ATTRIBUTES = ("colour", "size", "position")


@dataclasses.dataclass(frozen=True)
class Obj:
    """One object of a scene."""

    shape: str
    colour: str
    size: str
    position: str


@dataclasses.dataclass(frozen=True)
class Scene:
    """A toy scene: its id, background colour and objects (in drawing order)."""

    id: str
    background: str
    objects: tuple

    def to_dict(self):
        """Returns the scene as a JSON-ready dict."""
        return {
            "id": self.id,
            "background": self.background,
            "objects": [dataclasses.asdict(obj) for obj in self.objects],
        }

    @classmethod
    def from_dict(cls, data):
        """Returns the Scene stored by `to_dict`."""
        return cls(data["id"], data["background"], tuple(Obj(**obj) for obj in data["objects"]))


@dataclasses.dataclass(frozen=True)
class Mention:
    """An object as a caption states it; None for an attribute it leaves out."""

    shape: str
    colour: str | None = None
    size: str | None = None
    position: str | None = None


def scene_id(seed, index):
    """Returns the id of scene `index` of the world with `seed`."""
    return f"toy{seed}-{index:06d}"


def make_scene(seed, index, max_objects=4):
    """Returns scene `index` of the world with `seed`; independent of any other index."""
    rng = np.random.default_rng([seed, index])
    count = int(rng.integers(1, max_objects + 1))
    cells = rng.choice(len(POSITIONS), size=count, replace=False)
    pairs = [(s, c) for s in SHAPES for c in COLOURS]
    chosen = rng.choice(len(pairs), size=count, replace=False)
    objects = tuple(
        Obj(pairs[p][0], pairs[p][1], SIZES[int(rng.integers(2))], POSITIONS[int(cell)])
        for p, cell in zip(chosen, cells)
    )
    background = list(BACKGROUNDS)[int(rng.integers(len(BACKGROUNDS)))]
    return Scene(scene_id(seed, index), background, objects)


def make_scenes(seed, count, start=0):
    """Returns scenes start..start+count-1 of the world with `seed`."""
    return [make_scene(seed, index) for index in range(start, start + count)]


def _shape_points(shape, cx, cy, r):
    """Returns the polygon of `shape` centred at (cx, cy) with radius r."""
    if shape == "square":
        r *= 0.85
        return [(cx - r, cy - r), (cx + r, cy - r), (cx + r, cy + r), (cx - r, cy + r)]
    if shape == "triangle":
        return [(cx, cy - r), (cx + r * 0.95, cy + r * 0.8), (cx - r * 0.95, cy + r * 0.8)]
    if shape == "diamond":
        return [(cx, cy - r), (cx + r * 0.75, cy), (cx, cy + r), (cx - r * 0.75, cy)]
    angles = np.pi / 2 + np.arange(10) * np.pi / 5  # star: 5 outer, 5 inner points
    radii = np.where(np.arange(10) % 2 == 0, r, r * 0.42)
    return [(cx + q * np.cos(a), cy - q * np.sin(a)) for q, a in zip(radii, angles)]


def render(scene, size=128):
    """Returns the scene drawn as an RGB PIL image of size x size pixels."""
    image = Image.new("RGB", (size, size), BACKGROUNDS[scene.background])
    draw = ImageDraw.Draw(image)
    cell = size / 3
    # Small deterministic jitter so objects are not pixel-aligned to the grid.
    rng = np.random.default_rng(sum(map(ord, scene.id)))
    for obj in scene.objects:
        row, col = divmod(POSITIONS.index(obj.position), 3)
        cx, cy = (np.array([col, row]) + 0.5 + rng.uniform(-0.08, 0.08, 2)) * cell
        r = cell * (0.42 if obj.size == "large" else 0.22)
        colour = COLOURS[obj.colour]
        if obj.shape == "circle":
            draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=colour)
        else:
            draw.polygon(_shape_points(obj.shape, cx, cy, r), fill=colour)
    return image


def contact_sheet(seed, count=100, columns=10, size=128, gap=4):
    """Returns a PIL image tiling the first `count` scenes of the world with `seed`."""
    rows = -(-count // columns)
    sheet = Image.new(
        "RGB", (columns * (size + gap) + gap, rows * (size + gap) + gap), (90, 90, 90)
    )
    for index, scene in enumerate(make_scenes(seed, count)):
        row, col = divmod(index, columns)
        sheet.paste(render(scene, size), (gap + col * (size + gap), gap + row * (size + gap)))
    return sheet
