//! The HTML viewers. They work opened straight from the file system: the list of images is
//! written into the page (no fetch, which browsers refuse for file:// pages), and images load
//! by relative path.

/// A group's viewer: the per-step bar charts with a slider, play/pause and the arrow keys,
/// then the line charts and the GIF.
pub fn group_page(group: &str, frames: &[(usize, String)]) -> String {
    let list: String = frames.iter().map(|(step, file)| format!("{{\"step\":{step},\"src\":{}}}", serde_json::Value::from(file.as_str()))).collect::<Vec<_>>().join(", ");
    let first = frames.first().map_or(String::new(), |(_, file)| file.clone());
    let group = escape(group);
    format!(
        r#"<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>{group}</title>
<style>body{{font-family:sans-serif;margin:16px}} #controls{{margin:8px 0}} #slider{{width:500px;vertical-align:middle}} img{{display:block}}</style>
</head><body>
<h2>{group}</h2>
<div id="controls"><button id="play">Play</button>
<input id="slider" type="range" min="0" max="{max}" value="0"> <span id="label"></span>
<span style="color:#666">(← → step, space play/pause)</span></div>
<img id="frame" src="{first}" alt="bar chart at the selected evaluation step">
<h3>Over steps</h3><img src="over_steps.png" alt="line charts over evaluation steps">
<h3>Animation</h3><img src="animation.gif" alt="animation across evaluation steps">
<script>
const frames = [{list}];
const slider = document.getElementById("slider"), img = document.getElementById("frame");
const label = document.getElementById("label"), play = document.getElementById("play");
let timer = null;
function show(i) {{
  i = (i + frames.length) % frames.length;
  slider.value = i; img.src = frames[i].src;
  label.textContent = "step " + frames[i].step + " (" + (i + 1) + "/" + frames.length + ")";
}}
function toggle() {{
  if (timer) {{ clearInterval(timer); timer = null; play.textContent = "Play"; }}
  else {{ timer = setInterval(() => show(Number(slider.value) + 1), {delay}); play.textContent = "Pause"; }}
}}
slider.addEventListener("input", () => show(Number(slider.value)));
play.addEventListener("click", toggle);
document.addEventListener("keydown", (e) => {{
  if (e.key === "ArrowRight") show(Number(slider.value) + 1);
  else if (e.key === "ArrowLeft") show(Number(slider.value) - 1);
  else if (e.key === " ") {{ e.preventDefault(); toggle(); }}
}});
show(0);
</script>
</body></html>
"#,
        max = frames.len().saturating_sub(1),
        delay = crate::defaults::VIEWER_FRAME_MILLIS,
    )
}

/// `charts/index.html`: the Pareto chart of the arms and the environments' (when drawn), then
/// a link to each group's viewer.
pub fn index_page(groups: &[String], pareto: bool, environments: bool) -> String {
    let items: String = groups.iter().map(|g| format!("<li><a href=\"{0}/index.html\">{1}</a></li>\n", escape(g), escape(g))).collect();
    let pareto = match pareto {
        true => format!("<h2>Arms: task reward vs hack frequency</h2>\n<img src=\"{}\" alt=\"Pareto chart of the arms\">\n", super::pareto::FILE),
        false => String::new(),
    };
    let environments = match environments {
        true => format!(
            "<h2>Environments: retain vs hack</h2>\n<p><a href=\"{0}\">{0}</a></p>\n<img src=\"{0}\" alt=\"Pareto chart per environment\">\n",
            super::pareto_environments::FILE
        ),
        false => String::new(),
    };
    format!("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>sweep charts</title></head><body>\n{pareto}{environments}<h2>Experiment groups</h2>\n<ul>\n{items}</ul>\n</body></html>\n")
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}
