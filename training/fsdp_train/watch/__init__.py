"""What watches a run and tells of it.

Step times and rates (``steps``, ``metrics``), where each rank runs and how its collectives travel (``report``),
rank health and the flight recorder (``health``, ``flight``), a node's notice to stop (``notice``), the phases of
a start (``startup``) and the experiment tracker (``tracking``).

May import every room below it (``contract``, ``state``, ``datapath``, ``models``); never the entry points.
"""
