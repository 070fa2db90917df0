"""The course as a static website: `make site` (python -m website.build), see website/authors/website.md."""
