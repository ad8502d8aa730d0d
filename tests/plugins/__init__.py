"""Kinds of target that packages other than twophase add through their entry points
(each folder a package, each ``*.dist-info`` its metadata); the tests put them on
``sys.path`` themselves, so that twophase finds them only through the entry point."""
