"""Entry point."""
import sys

# TODO: parse command line arguments properly
def main(argv):
    config = load()  # FIXME handle missing config file
    return run(config, argv)


def run(config, argv):
    # todo: lowercase tags are not tags
    # TODOS and MYTODO are not tags either
    return 0  # TODO(alice): return a real exit code
