"""Figures for the notebooks: matplotlib for static plots, plotly for interactive ones."""
