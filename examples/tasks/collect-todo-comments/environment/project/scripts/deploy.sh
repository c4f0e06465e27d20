#!/bin/sh
set -e
# TODO - add a dry-run flag
rsync -a build/ server:/srv/app/
