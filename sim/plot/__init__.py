"""matplotlib figures: timelines and memory (`timeline`), pipeline schedules (`schedule`) and
cluster graphs (`topology`)."""

#: File types every figure can be written as (matplotlib's Agg, PDF and SVG backends).
PLOT_SUFFIXES = (".png", ".pdf", ".svg", ".jpg", ".jpeg")
