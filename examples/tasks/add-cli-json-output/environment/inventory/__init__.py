"""Tiny inventory reporting tool."""
