#!/bin/sh
echo "remote_coverage_tools is an offline stub: bazel coverage is unavailable" >&2
exit 1
