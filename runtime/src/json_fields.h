// Typed reads of JSON fields that name the field when it is missing or of another type ("META field
// max_rows: expected an integer in [-2147483648, 2147483647], got \"x\""), where nlohmann's get<T>() throws a
// type_error that names neither, or silently narrows a number. Header-only: used by the plan reader and the
// CLI's `g4 inspect`; the caller catches std::runtime_error and adds the file.
#pragma once
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace g4::jsonf {

template <class T> struct is_vector : std::false_type {};
template <class T> struct is_vector<std::vector<T>> : std::true_type {};

template <class T> bool has_type(const nlohmann::json& v) {
    if constexpr (std::is_same_v<T, std::string>)
        return v.is_string();
    else if constexpr (std::is_same_v<T, bool>)
        return v.is_boolean();
    else if constexpr (std::is_floating_point_v<T>)
        return v.is_number();
    else if constexpr (std::is_integral_v<T>) {
        if (v.is_number_unsigned()) return v.get<uint64_t>() <= uint64_t(std::numeric_limits<T>::max());
        if (!v.is_number_integer()) return false;
        const int64_t x = v.get<int64_t>();
        return x >= int64_t(std::numeric_limits<T>::min()) &&
               (x < 0 || uint64_t(x) <= uint64_t(std::numeric_limits<T>::max()));
    } else {
        static_assert(is_vector<T>::value, "string, bool, number or vector of those");
        if (!v.is_array()) return false;
        for (const auto& e : v)
            if (!has_type<typename T::value_type>(e)) return false;
        return true;
    }
}

template <class T> std::string type_name() {
    if constexpr (std::is_same_v<T, std::string>)
        return "a string";
    else if constexpr (std::is_same_v<T, bool>)
        return "true or false";
    else if constexpr (std::is_floating_point_v<T>)
        return "a number";
    else if constexpr (std::is_integral_v<T>)
        return "an integer in [" + std::to_string(std::numeric_limits<T>::min()) + ", " +
               std::to_string(std::numeric_limits<T>::max()) + "]";
    else
        return "an array of " + type_name<typename T::value_type>() + " values";
}

// `v` (nullptr: absent) as T, or std::runtime_error("META field FIELD: ...").
template <class T> T checked(const nlohmann::json* v, const std::string& field) {
    if (!v) throw std::runtime_error("META field " + field + " is missing");
    if (!has_type<T>(*v)) {
        std::string got = v->is_primitive() ? v->dump() : std::string(v->type_name());
        if (got.size() > 40) got = got.substr(0, 37) + "...";
        throw std::runtime_error("META field " + field + ": expected " + type_name<T>() + ", got " + got);
    }
    return v->get<T>();
}

// obj[key] as T; absent or of another type: an error naming key.
template <class T> T get(const nlohmann::json& obj, const char* key) {
    if (!obj.is_object())
        throw std::runtime_error(std::string("META field ") + key + ": its parent is not an object");
    auto it = obj.find(key);
    return checked<T>(it == obj.end() ? nullptr : &*it, key);
}
// arr[i] as T, named name[i] in errors.
template <class T> T get(const nlohmann::json& arr, size_t i, const char* name) {
    return checked<T>(arr.is_array() && i < arr.size() ? &arr[i] : nullptr,
                      std::string(name) + "[" + std::to_string(i) + "]");
}
// obj[key] as T, or dflt when obj has no such key; present with another type: an error naming key.
template <class T> T value(const nlohmann::json& obj, const char* key, const T& dflt) {
    if (!obj.is_object() || !obj.contains(key)) return dflt;
    return get<T>(obj, key);
}

} // namespace g4::jsonf
