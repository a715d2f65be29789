"""Readers for public captioning sets, producing image records (see records.py).

Both take the rows as JSONL (one object per line) or JSON (a list of objects), e.g. exported
from the Hugging Face parquet files, plus a local folder of already downloaded images:

PixMo-Cap (allenai/pixmo-cap): rows {"image_url", "caption", "transcripts"}. Images are looked
  up in `image_dir` as a file named by the sha256 hex digest of the URL (any extension, e.g.
  `9f86d0....jpg`: the name a download script can compute without parsing URLs), falling back
  to the URL's basename (`https://host/a/b/cat.jpg` -> `cat.jpg`). Record id: the first 16 hex
  digits of that digest. References: the caption; with transcripts_as_references=True the
  annotators' spoken transcripts are added as further references.
DenseFusion-4V-100K: rows {"image_id", "image_path", "caption"}; image_path is relative to
  `image_dir`; the record id is image_id.

Bad rows follow records.collect: strict=True raises BadRecord naming the row, otherwise they
are skipped, counted per reason and logged.
"""

import hashlib
import json
import os
import urllib.parse

from mocojax.data import records as records_lib


def read_table(path):
    """Yields the rows (dicts) of a .jsonl or .json file; bad JSON lines yield BadRecord."""
    if path.endswith(".json"):
        with open(path) as f:
            yield from json.load(f)
    else:
        yield from records_lib.read_rows(path)


def url_digest(url):
    """Returns the sha256 hex digest of a URL: the file stem PixMo images are stored under."""
    return hashlib.sha256(url.encode("utf-8")).hexdigest()


def _index_folder(image_dir):
    """Returns {file name: path} and {file stem: path} for the files directly in image_dir."""
    by_name, by_stem = {}, {}
    with os.scandir(image_dir) as entries:
        for entry in entries:
            if entry.is_file():
                by_name[entry.name] = entry.path
                by_stem.setdefault(os.path.splitext(entry.name)[0], entry.path)
    return by_name, by_stem


def _require(row, key, record_id):
    """Returns row[key]; raises BadRecord (missing field / empty caption) if unusable."""
    value = row.get(key) if isinstance(row, dict) else None
    blank = isinstance(value, str) and not value.strip()
    if value is None or (blank and key != "caption"):
        raise records_lib.bad_record(record_id, "missing_field", f"field {key!r} is missing")
    if blank:
        raise records_lib.bad_record(record_id, "empty_caption", "caption is empty")
    return value


def load_pixmo_cap(
    path, image_dir, strict=False, check_images=True, transcripts_as_references=False
):
    """Returns (image records, LoadReport) for PixMo-Cap rows with images in image_dir."""
    by_name, by_stem = _index_folder(image_dir)

    def convert(row):
        row = records_lib.raise_if_bad(row)
        url = _require(row, "image_url", "?")
        digest = url_digest(url)
        record_id = digest[:16]
        caption = _require(row, "caption", record_id)
        basename = os.path.basename(urllib.parse.urlparse(url).path)
        image = by_stem.get(digest) or by_name.get(basename)
        if image is None:
            raise records_lib.bad_record(
                record_id,
                "missing_image",
                f"no image for {url} in {image_dir} (looked for {digest}.* and {basename!r})",
            )
        references = [caption]
        if transcripts_as_references:
            transcripts = row.get("transcripts") or []
            if not isinstance(transcripts, list):
                raise records_lib.bad_record(
                    record_id, "bad_field", "field 'transcripts' must be a list"
                )
            references += [t for t in transcripts if not isinstance(t, str) or t.strip()]
        # Found by scanning image_dir, so relative to it (validate refuses absolute paths).
        raw = {"id": record_id, "image": os.path.basename(image), "references": references}
        record = records_lib.validate(raw, image_dir, check_images)
        record["source_url"] = url
        return record

    return records_lib.collect(read_table(path), convert, strict, name=path)


def load_densefusion(path, image_dir, strict=False, check_images=True):
    """Returns (image records, LoadReport) for DenseFusion-4V-100K rows under image_dir."""

    def convert(row):
        row = records_lib.raise_if_bad(row)
        record_id = str(_require(row, "image_id", "?"))
        image = _require(row, "image_path", record_id)
        caption = _require(row, "caption", record_id)
        raw = {"id": record_id, "image": image, "references": [caption]}
        return records_lib.validate(raw, image_dir, check_images)

    return records_lib.collect(read_table(path), convert, strict, name=path)
