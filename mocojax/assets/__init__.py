"""Files that ship with mocojax: the toy base model (`toybase/`, an HF directory built by
configs/toybase.py; see docs/toyworld.md)."""
