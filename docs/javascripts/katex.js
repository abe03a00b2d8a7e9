// Typesets the math that pymdownx.arithmatex (generic mode) leaves in the page: each element of class
// "arithmatex" holds \(...\) (inline) or \[...\] (display). Material's document$ fires on every page load,
// including instant navigation.
document$.subscribe(({ body }) => {
  for (const element of body.querySelectorAll(".arithmatex")) {
    const tex = element.textContent.trim();
    katex.render(tex.slice(2, -2), element, {
      displayMode: tex.startsWith("\\["),
      throwOnError: false,
    });
  }
});
