// Draws the course's interactive figures (attention maps with a slider) with the site's own copy of
// plotly.js. Each figure carries its plotly specification as JSON, and its static picture as the fallback for
// a reader without JavaScript, removed here before the map is drawn.
(function () {
  function draw() {
    document.querySelectorAll(".course-interactive").forEach(function (figure) {
      var spec = JSON.parse(figure.querySelector("script.course-spec").textContent);
      var config = Object.assign({}, spec.config || {}, {responsive: true, displaylogo: false});
      var fallback = figure.querySelector("img.course-static");
      if (fallback) { fallback.remove(); }
      window.Plotly.newPlot(figure.querySelector(".course-plot"), spec.data, spec.layout, config);
    });
  }
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", draw);
  } else {
    draw();
  }
})();
