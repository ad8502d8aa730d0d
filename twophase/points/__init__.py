"""Rows to points: the line protocol (:mod:`.lineproto`), time values (:mod:`.timestamps`),
rows to lines or rejections (:mod:`.builder`) and grouping lines into chunks and requests
(:mod:`.batching`). Pure logic, imported by executors: nothing here talks to a server."""
