#!/bin/bash
# healthcheck job (placeholder)
echo "healthcheck ran at $(date)"
