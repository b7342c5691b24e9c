"""Testing tools that ship with tilec: the differential fuzzer (`python -m tilec.testing.fuzz`), its program
generator (gen), oracle (oracle) and reproducer minimiser (minimize)."""
