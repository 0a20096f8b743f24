//! Just enough HTML reading for the browser: a link by its text, the
//! first form's action and fields, a tag's attribute.

/// The `href` of the first `<a>` in `html` whose text contains `text`.
pub(super) fn link(html: &str, text: &str) -> Option<String> {
    let mut rest = html;
    while let Some(at) = rest.find("<a ") {
        let tag = &rest[at..];
        let close = tag.find('>')?;
        let end = tag.find("</a>").unwrap_or(tag.len());
        if end > close && tag[close + 1..end].contains(text) {
            return attribute(&tag[..close], "href");
        }
        rest = &tag[close..];
    }
    None
}

/// The action and hidden inputs of the first `<form>` in `html`.
pub(super) fn first_form(html: &str) -> Option<(String, Vec<(String, String)>)> {
    let start = html.find("<form")?;
    let end = html[start..].find("</form>").map_or(html.len(), |e| start + e);
    let form = &html[start..end];
    let tag_end = form.find('>')?;
    let action = attribute(&form[..tag_end], "action")?;
    let mut fields = Vec::new();
    let mut rest = &form[tag_end..];
    while let Some(at) = rest.find("<input") {
        let tag = &rest[at..];
        let close = tag.find('>').unwrap_or(tag.len());
        let input = &tag[..close];
        if attribute(input, "type").as_deref() == Some("hidden")
            && let (Some(name), Some(value)) = (attribute(input, "name"), attribute(input, "value"))
        {
            fields.push((name, value));
        }
        rest = &tag[close..];
    }
    Some((action, fields))
}

/// `name="value"` in a tag, with the HTML escapes the provider writes undone.
fn attribute(tag: &str, name: &str) -> Option<String> {
    let needle = format!(" {name}=\"");
    let start = tag.find(&needle)? + needle.len();
    let end = tag[start..].find('"')? + start;
    Some(
        tag[start..end]
            .replace("&quot;", "\"")
            .replace("&#39;", "'")
            .replace("&lt;", "<")
            .replace("&gt;", ">")
            .replace("&amp;", "&"),
    )
}
