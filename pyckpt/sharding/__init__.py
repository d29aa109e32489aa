"""Geometry of sharded arrays: boxes, partitions, overlap queries."""
