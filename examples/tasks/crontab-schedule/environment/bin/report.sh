#!/bin/bash
# report job (placeholder)
echo "report ran at $(date)"
