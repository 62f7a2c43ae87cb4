"""The /dashboard page (helios.server.debug serves these files): index.html, dashboard.js and
dashboard.css, plain HTML and JavaScript with no build step, and uPlot 1.6.32 (MIT, LICENSE-uPlot),
vendored unchanged from the npm registry's `uplot` package (dist/uPlot.iife.min.js, dist/uPlot.min.css)."""
