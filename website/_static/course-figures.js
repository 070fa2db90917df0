// Draws the course's interactive figures (attention maps with a slider) with the site's own copy of
// plotly.js. Each figure carries its plotly specification as JSON; its static picture follows it.
(function () {
  function draw() {
    document.querySelectorAll(".course-interactive").forEach(function (figure) {
      var spec = JSON.parse(figure.querySelector("script.course-spec").textContent);
      var config = Object.assign({}, spec.config || {}, {responsive: true, displaylogo: false});
      window.Plotly.newPlot(figure.querySelector(".course-plot"), spec.data, spec.layout, config);
    });
  }
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", draw);
  } else {
    draw();
  }
})();
