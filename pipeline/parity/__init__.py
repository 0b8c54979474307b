"""Parity harness: the native engine against the Python reference, bit for bit.

record  runs real vLLM workloads with the reference wrapped by a recorder that
        writes every connector call, its inputs and its return (trace.py);
replay  drives the reference (twice) and the native engine through the same
        calls, feeding each implementation its own outputs (replay.py);
compare gates a cell bitwise where the reference agrees with itself, and
        reports the others (cells.py, report in __main__).
"""
