#!/bin/bash
# cleanup job (placeholder)
echo "cleanup ran at $(date)"
