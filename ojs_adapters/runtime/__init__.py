"""What both adapters share at run time (DESIGN.md "Layers"): imports the core only."""
