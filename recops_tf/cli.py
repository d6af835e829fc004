"""The `recops-tf` command line."""
import argparse
import sys


def main(argv=None):
    parser = argparse.ArgumentParser(prog="recops-tf", description="recops_tf tools")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("bench", add_help=False,
                   help="benchmark every op against its plain-TensorFlow composite")
    args, rest = parser.parse_known_args(argv)
    if args.command == "bench":
        from recops_tf import bench

        return bench.main(rest)
    return 2


if __name__ == "__main__":
    sys.exit(main())
