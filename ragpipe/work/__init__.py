"""Expensive work as steps: semantic keys apart from execution policy, cached, admitted, costed."""
