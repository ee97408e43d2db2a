// The page's loader: unpack the one embedded plotly.js, then draw every figure from its JSON spec.
// When it is done, <body> carries data-figures-expected/-rendered, data-main-svgs and data-errors
// (the browser test reads them; a reader sees any error printed at the end of the page).
(function () {
  "use strict";
  var errors = window.pcieprofErrors;

  function finish() {
    var body = document.body;
    body.setAttribute("data-figures-expected", String(document.querySelectorAll(".figure .plot").length));
    body.setAttribute("data-figures-rendered", String(document.querySelectorAll(".figure .js-plotly-plot").length));
    body.setAttribute("data-main-svgs", String(document.querySelectorAll(".figure .js-plotly-plot .main-svg").length));
    body.setAttribute("data-errors", String(errors.length));
    if (errors.length) {
      var p = document.createElement("pre");
      p.className = "note note-warn";
      p.textContent = "page errors: " + errors.join("; ");
      body.appendChild(p);
    }
    body.setAttribute("data-done", "1");
  }

  // The packed text (page.pack7) -> bytes: 7 bits per character, most significant first; a
  // character from U+0100 on stands for an unsafe value (unsafe[index]) and the value after it.
  function unpack7(text, nbytes, unsafe) {
    var out = new Uint8Array(nbytes);
    var acc = 0, nacc = 0, o = 0;
    function push(v) {
      acc = (acc << 7) | v;
      nacc += 7;
      if (nacc >= 8) {
        nacc -= 8;
        if (o < nbytes) out[o++] = (acc >> nacc) & 255;
        acc &= (1 << nacc) - 1;
      }
    }
    for (var i = 0; i < text.length; i++) {
      var c = text.charCodeAt(i);
      if (c < 128) { push(c); } else { c -= 256; push(unsafe[c >> 7]); push(c & 127); }
    }
    return out;
  }

  // {"$shared": k} -> the k-th shared array (arrays two figures have in common are stored once).
  function resolve(v, shared) {
    if (Array.isArray(v)) return v.map(function (x) { return resolve(x, shared); });
    if (v !== null && typeof v === "object") {
      if (Object.prototype.hasOwnProperty.call(v, "$shared")) return resolve(shared[v.$shared], shared);
      var o = {};
      Object.keys(v).forEach(function (key) { o[key] = resolve(v[key], shared); });
      return o;
    }
    return v;
  }

  function draw() {
    var doc = JSON.parse(document.getElementById("pcieprof-figures").textContent);
    var pending = doc.figures.map(function (f) {
      var layout = resolve(f.layout, doc.shared);
      layout.template = doc.template;
      return Promise.resolve()
        .then(function () { return Plotly.newPlot(f.id, resolve(f.data, doc.shared), layout, doc.config); })
        .catch(function (e) { errors.push("figure " + f.id + ": " + e); });
    });
    return Promise.all(pending);
  }

  var packed = document.getElementById("pcieprof-plotly");
  if (typeof DecompressionStream === "undefined") {
    errors.push("this browser cannot unpack the page's plotly.js (it needs DecompressionStream: " +
                "Chromium 80+, Firefox 113+, Safari 16.4+); the figures are not drawn");
    finish();
    return;
  }
  var text = packed.textContent;
  text = text.slice(text.indexOf("*/") + 2);  // after the comment that names the version
  var bytes = unpack7(text, Number(packed.getAttribute("data-bytes")),
                      JSON.parse(packed.getAttribute("data-unsafe")));
  var stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("deflate-raw"));
  new Response(stream).text()
    .then(function (source) {
      var script = document.createElement("script");
      script.textContent = source;
      document.head.appendChild(script);
      return draw();
    })
    .catch(function (e) { errors.push("plotly.js: " + e); })
    .then(finish);
})();
