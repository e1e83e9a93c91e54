// The rows of data_formats() (data/settings.h) are written next to the code of their formats: settings_formats.cpp
// (idx, csv, npy, synthetic, tokens) and settings_images.cpp (images). This header joins them to the table in
// settings.cpp and holds what the rows share (data.scale, data.normalize). Not for use outside lib/data.
#pragma once

#include "config/schema.h"
#include "data/settings.h"

#include <vector>

namespace gt::data_rows {

/// The rows of idx, csv, npy, synthetic and tokens, in that order.
std::vector<DataFormatSpec> tensor_format_rows();
/// The row of images.
DataFormatSpec image_format_row();

/// data.scale: a float the inputs are multiplied by.
extern const KeySpec kScaleKey;
void read_scale(const ConfigNode& d, DataConfig& out);
/// data.normalize: one mean and one std per channel, applied after scale.
extern const KeySpec kNormalize;
/// Reads data.normalize when present; `channels` > 0: the count the values must have (known from the config).
void parse_normalize(const ConfigNode& d, DataConfig& out, int64_t channels);
void write_normalize(const DataConfig& c, YAML::Node& d);

}  // namespace gt::data_rows
