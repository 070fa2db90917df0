"""The course as a static website: `make site` (python -m website.build), see README, "The course as a website"."""
