#!/bin/bash
# rotate-logs job (placeholder)
echo "rotate-logs ran at $(date)"
