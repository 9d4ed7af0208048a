"""Benchmarks: ``python -m bench <name> [options]`` runs ``bench/<name>.py``'s ``main(argv)``.

``python -m bench all`` runs every benchmark; ``python -m bench list`` names them. Results go to
``bench/results/<name>.json``.
"""
