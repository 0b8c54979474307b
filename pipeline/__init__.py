"""ActiveKV's release pipeline: one module per stage; noxfile.py wires them."""
