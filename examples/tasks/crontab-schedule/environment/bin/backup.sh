#!/bin/bash
# backup job (placeholder)
echo "backup ran at $(date)"
