/* A log line's colours: its style spans ([start, end, "sgr"], offsets in code points, the
   SGR parameters normalised by logcapture.sgr) drawn as <span>s. The 16 colours and the
   attributes are CSS classes (app.css, light and dark); 256 and true colours inline. */
"use strict";

const LC_SGR = (() => {
  // xterm's 256-colour palette beyond the 16: a 6x6x6 cube, then 24 greys.
  function rgb256(n) {
    if (n >= 232) { const v = 8 + 10 * (n - 232); return `rgb(${v},${v},${v})`; }
    n -= 16;
    const c = k => (k ? 55 + 40 * k : 0);
    return `rgb(${c(Math.floor(n / 36))},${c(Math.floor(n / 6) % 6)},${c(n % 6)})`;
  }

  // "1;38;5;208;44" -> {fg, bg (a class number 30-37/90-97 (40-47/100-107 for bg) or a CSS
  // colour), attrs}. Anything unexpected is ignored: the page draws text, never markup.
  function parse(sgr) {
    const p = String(sgr).split(";").map(Number);
    const out = {fg: null, bg: null, attrs: []};
    for (let i = 0; i < p.length; i++) {
      const c = p[i];
      if (c === 38 || c === 48) {
        let colour = null;
        if (p[i + 1] === 5 && p[i + 2] >= 0 && p[i + 2] <= 255) {
          const n = p[i + 2];
          colour = n < 8 ? 30 + n : n < 16 ? 82 + n : rgb256(n);
          i += 2;
        } else if (p[i + 1] === 2 && p.slice(i + 2, i + 5).every(v => v >= 0 && v <= 255)) {
          colour = `rgb(${p[i + 2]},${p[i + 3]},${p[i + 4]})`;
          i += 4;
        } else break;
        if (c === 38) out.fg = colour;
        else out.bg = typeof colour === "number" ? colour + 10 : colour;
      } else if ((c >= 30 && c <= 37) || (c >= 90 && c <= 97)) out.fg = c;
      else if ((c >= 40 && c <= 47) || (c >= 100 && c <= 107)) out.bg = c;
      else if ([1, 2, 3, 4, 7].includes(c)) out.attrs.push(c);
    }
    return out;
  }

  const cache = new Map();
  // The class and inline style of one normalised SGR string.
  function look(sgr) {
    let hit = cache.get(sgr);
    if (hit) return hit;
    let {fg, bg, attrs} = parse(sgr);
    const cls = ["sgr"], css = [];
    if (attrs.includes(7)) {  // inverse: the colours swapped (the defaults included)
      const f = fg, b = bg;
      fg = typeof b === "number" ? b - 10 : b;
      bg = typeof f === "number" ? f + 10 : f;
      if (fg === null) cls.push("sgr-fg-inv");
      if (bg === null) cls.push("sgr-bg-inv");
    }
    if (typeof fg === "number") cls.push("sgr-" + fg); else if (fg) css.push("color:" + fg);
    if (typeof bg === "number") cls.push("sgr-" + bg); else if (bg) css.push("background:" + bg);
    for (const a of attrs) if (a !== 7) cls.push("sgr-a" + a);
    hit = {cls: cls.join(" "), css: css.join(";")};
    if (cache.size > 1000) cache.clear();
    cache.set(sgr, hit);
    return hit;
  }

  // Code-point offsets -> UTF-16 indexes (JS strings): only a text with characters beyond
  // the BMP (emoji) needs the table.
  function utf16(text) {
    if (!/[\uD800-\uDFFF]/.test(text)) return null;
    const at = [0];
    let i = 0;
    for (const ch of text) { i += ch.length; at.push(i); }
    return at;
  }

  // The children of a line's text element: plain text between styled <span>s.
  function nodes(text, style) {
    if (!Array.isArray(style) || !style.length) return [text];
    const at = utf16(text);
    const pos = k => (at ? at[Math.min(k, at.length - 1)] : k);
    const out = [];
    let last = 0;
    for (const s of style) {
      if (!Array.isArray(s) || s.length !== 3) continue;
      const a = pos(s[0]), b = pos(s[1]);
      if (!(a >= last && b > a)) continue;
      if (a > last) out.push(text.slice(last, a));
      const {cls, css} = look(s[2]);
      const span = document.createElement("span");
      span.className = cls;
      if (css) span.style.cssText = css;
      span.textContent = text.slice(a, b);
      out.push(span);
      last = b;
    }
    if (last < text.length) out.push(text.slice(last));
    return out;
  }

  return {nodes, parse};
})();
