"""The preview's GLSL (OpenGL 3.3 core): shaded colour, shadow depth, and object ids.

Shading: Lambert diffuse plus a normalised Blinn-Phong highlight (shininess from roughness, F0 from
metallic as glTF defines), a hemisphere ambient term (glTF has no ambient light; without one,
faces turned from the sun are black), a 3x3 PCF shadow from the first directional light, and
two-sided lighting so planes and open meshes seen from behind are lit too. Colours are linear
and encoded to sRGB at the end, as glTF's are.
"""

MAX_LIGHTS = 8

SHADED_VERTEX = """
#version 330
uniform mat4 u_model;
uniform mat3 u_normal_matrix;
uniform mat4 u_view_projection;
uniform mat4 u_light_view_projection;
in vec3 in_position;
in vec3 in_normal;
out vec3 v_world;
out vec3 v_normal;
out vec4 v_light_clip;
void main() {
    vec4 world = u_model * vec4(in_position, 1.0);
    v_world = world.xyz;
    v_normal = u_normal_matrix * in_normal;
    v_light_clip = u_light_view_projection * world;
    gl_Position = u_view_projection * world;
}
"""

SHADED_FRAGMENT = """
#version 330
#define MAX_LIGHTS %d
#define PI 3.14159265
uniform vec3 u_albedo;
uniform float u_opacity;
uniform float u_metallic;
uniform float u_roughness;
uniform vec3 u_emissive;
uniform vec3 u_eye;
uniform vec3 u_sky;
uniform vec3 u_ground;
uniform int u_light_count;
uniform int u_light_type[MAX_LIGHTS];      // 0 directional, 1 point, 2 spot
uniform vec3 u_light_radiance[MAX_LIGHTS]; // colour x intensity, in units of the reference lux
uniform vec3 u_light_position[MAX_LIGHTS];
uniform vec3 u_light_direction[MAX_LIGHTS]; // the way the light travels
uniform float u_light_range[MAX_LIGHTS];    // 0 = unlimited
uniform vec2 u_light_cone[MAX_LIGHTS];      // cos(outer), cos(inner)
uniform int u_shadow_light;                 // the light that casts shadows, -1 for none
uniform sampler2D u_shadow_map;
in vec3 v_world;
in vec3 v_normal;
in vec4 v_light_clip;
out vec4 f_color;

float lit_fraction(float n_dot_l) {
    vec3 p = v_light_clip.xyz / v_light_clip.w * 0.5 + 0.5;
    if (p.z > 1.0 || any(lessThan(p.xy, vec2(0.0))) || any(greaterThan(p.xy, vec2(1.0)))) return 1.0;
    // the bias grows at grazing angles, where one texel covers a long stretch of surface
    float bias = 0.0008 + 0.002 * (1.0 - n_dot_l);
    vec2 texel = 1.0 / vec2(textureSize(u_shadow_map, 0));
    float lit = 0.0;
    for (int x = -1; x <= 1; x++)
        for (int y = -1; y <= 1; y++)
            lit += (p.z - bias <= texture(u_shadow_map, p.xy + vec2(x, y) * texel).r) ? 1.0 : 0.0;
    return lit / 9.0;
}

void main() {
    vec3 n = normalize(v_normal);
    vec3 v = normalize(u_eye - v_world);
    if (dot(n, v) < 0.0) n = -n;
    vec3 diffuse = u_albedo * (1.0 - u_metallic);
    vec3 f0 = mix(vec3(0.04), u_albedo, u_metallic);
    float r2 = max(u_roughness * u_roughness, 0.03);
    float shininess = 2.0 / (r2 * r2) - 2.0;
    vec3 color = u_albedo * mix(u_ground, u_sky, 0.5 + 0.5 * n.y);
    for (int i = 0; i < u_light_count; i++) {
        vec3 l;
        float attenuation = 1.0;
        if (u_light_type[i] == 0) {
            l = -u_light_direction[i];
        } else {
            vec3 to_light = u_light_position[i] - v_world;
            float d = max(length(to_light), 1e-4);
            l = to_light / d;
            attenuation = 1.0 / (d * d);
            if (u_light_range[i] > 0.0)
                attenuation *= clamp(1.0 - pow(d / u_light_range[i], 4.0), 0.0, 1.0);
            if (u_light_type[i] == 2)
                attenuation *= smoothstep(u_light_cone[i].x, u_light_cone[i].y, dot(-l, u_light_direction[i]));
        }
        float n_dot_l = dot(n, l);
        if (n_dot_l <= 0.0) continue;
        if (i == u_shadow_light) attenuation *= lit_fraction(n_dot_l);
        vec3 h = normalize(l + v);
        float highlight = pow(max(dot(n, h), 0.0), shininess) * (shininess + 8.0) / (8.0 * PI);
        color += (diffuse + f0 * highlight) * u_light_radiance[i] * n_dot_l * attenuation;
    }
    color += u_emissive;
    color = color / (1.0 + 0.25 * max(color - 0.8, 0.0));  // soft shoulder instead of a hard clip
    f_color = vec4(pow(clamp(color, 0.0, 1.0), vec3(1.0 / 2.2)), u_opacity);
}
""" % MAX_LIGHTS

DEPTH_VERTEX = """
#version 330
uniform mat4 u_model;
uniform mat4 u_view_projection;
in vec3 in_position;
void main() { gl_Position = u_view_projection * u_model * vec4(in_position, 1.0); }
"""

DEPTH_FRAGMENT = """
#version 330
void main() {}
"""

# ids in 24 bits over RGB: exact in an 8-bit RGBA buffer without MSAA, and clearing it to 0 is
# well defined (clearing an integer buffer with glClearColor is not)
ID_FRAGMENT = """
#version 330
uniform int u_id;
out vec4 f_color;
void main() { f_color = vec4(float(u_id & 255), float((u_id >> 8) & 255), float((u_id >> 16) & 255), 255.0) / 255.0; }
"""
