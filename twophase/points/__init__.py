"""Rows to points: the line protocol ([`twophase.points.lineproto`][twophase.points.lineproto]),
time values ([`twophase.points.timestamps`][twophase.points.timestamps]),
rows to lines or rejections ([`twophase.points.builder`][twophase.points.builder]) and grouping
lines into chunks and requests
([`twophase.points.batching`][twophase.points.batching]). Pure logic, imported by executors: nothing
here talks to a server."""
