"""Concrete environments built on `clotho.env`."""
